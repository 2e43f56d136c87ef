//! `berth job validate` and `berth run`: a one-shot embedded agent that runs a job,
//! streams its events as they happen, prints the tasks' output and exits with the job's
//! outcome.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use crate::alloc_runner::{AllocRunner, ClientStatus};
use crate::config::AgentConfig;
use crate::driver_set::DriverSet;
use crate::events::AllocEvent;
use crate::jobspec::{self, Job, JobspecError};

/// Exit code for a jobspec that does not pass validation.
const INVALID: u8 = 2;

async fn parse_and_check(
    path: &Path,
    drivers: &DriverSet,
    config: &AgentConfig,
) -> Result<Job, JobspecError> {
    let job = jobspec::parse_file(path)?;
    let problems = crate::validate::validate(&job, drivers, config).await;
    if problems.is_empty() {
        Ok(job)
    } else {
        Err(JobspecError {
            file: path.display().to_string(),
            problems,
        })
    }
}

pub(super) async fn validate(
    path: &Path,
    drivers: &DriverSet,
    config: &AgentConfig,
) -> anyhow::Result<ExitCode> {
    match parse_and_check(path, drivers, config).await {
        Ok(job) => {
            println!(
                "Job validation successful: job {:?}, {} group(s)",
                job.name,
                job.groups.len()
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(error) => {
            eprintln!("Job validation failed: {error}");
            Ok(ExitCode::from(INVALID))
        }
    }
}

pub(super) async fn run(
    path: &Path,
    drivers: &DriverSet,
    config: AgentConfig,
    data_dir: &Path,
) -> anyhow::Result<ExitCode> {
    let job = match parse_and_check(path, drivers, &config).await {
        Ok(job) => Arc::new(job),
        Err(error) => {
            eprintln!("Job validation failed: {error}");
            return Ok(ExitCode::from(INVALID));
        }
    };
    let config = Arc::new(config);
    let (sender, mut events) = tokio::sync::mpsc::unbounded_channel();
    let mut allocs = Vec::new();
    for (group_index, group) in job.groups.iter().enumerate() {
        for alloc_index in 0..group.count {
            allocs.push(AllocRunner::new(
                job.clone(),
                group_index,
                alloc_index,
                data_dir,
                drivers.clone(),
                config.clone(),
                sender.clone(),
            ));
        }
    }
    drop(sender);
    println!(
        "==> Running job {:?}: {} allocation(s)",
        job.name,
        allocs.len()
    );
    for alloc in &allocs {
        println!("    {} {}", alloc.id, alloc.name);
    }
    let mut running = tokio::task::JoinSet::new();
    for alloc in &allocs {
        running.spawn(alloc.clone().run());
    }
    let mut interrupted = false;
    loop {
        tokio::select! {
            Some(event) = events.recv() => print_event(&event),
            finished = running.join_next() => {
                if finished.is_none() {
                    break;
                }
            }
            _ = tokio::signal::ctrl_c(), if !interrupted => {
                interrupted = true;
                println!("==> Interrupted: stopping the allocations");
                for alloc in &allocs {
                    alloc.stop();
                }
            }
        }
    }
    while let Ok(event) = events.try_recv() {
        print_event(&event);
    }
    let mut all_complete = true;
    for alloc in &allocs {
        let status = alloc.status();
        all_complete &= status.client_status == ClientStatus::Complete;
        for task in status.tasks.keys() {
            print_log(&alloc.name, task, "stdout", &alloc.alloc_dir.stdout(task));
            print_log(&alloc.name, task, "stderr", &alloc.alloc_dir.stderr(task));
        }
        println!(
            "==> {} {}: {:?}",
            alloc.name, alloc.id, status.client_status
        );
    }
    Ok(if interrupted {
        ExitCode::from(130)
    } else if all_complete {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn print_event(event: &AllocEvent) {
    println!(
        "    {}  {}  {}  {:<15} {}",
        clock(event.event.time_ms),
        event.alloc_name,
        event.task,
        event.event.kind.to_string(),
        event.event.message
    );
}

fn print_log(alloc: &str, task: &str, stream: &str, path: &Path) {
    let Ok(text) = std::fs::read_to_string(path) else {
        return;
    };
    if text.is_empty() {
        return;
    }
    println!("--- {alloc} {task} {stream} ({}) ---", path.display());
    print!("{text}");
    if !text.ends_with('\n') {
        println!();
    }
}

/// `HH:MM:SS.mmm` UTC.
fn clock(time_ms: u64) -> String {
    let seconds = time_ms / 1000;
    format!(
        "{:02}:{:02}:{:02}.{:03}",
        seconds / 3600 % 24,
        seconds / 60 % 60,
        seconds % 60,
        time_ms % 1000
    )
}
