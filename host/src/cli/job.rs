//! `berth job validate|run|status|stop|dispatch|periodic force` and `berth run`: a one-shot embedded agent (state
//! in memory) that runs a job, streams its events as they happen, prints the tasks'
//! output and exits with the job's outcome.

use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;

use super::output::{clock, one_line, print_event};
use crate::agent::{Agent, AgentOptions, JobStatus, StateLocation, SubmitError, Submitted};
use crate::alloc_runner::AllocStatus;
use crate::api::client::{Client, ClientError};
use crate::api::{Stopped, SubmitRequest};
use crate::config::AgentConfig;
use crate::driver_set::DriverSet;
use crate::hook_set::HookSet;
use crate::jobspec::eval::VariableInputs;
use crate::jobspec::{self, Job, JobspecError};
use crate::model::events::TaskStateKind;
use crate::model::status::ClientStatus;

/// Exit code for a jobspec that does not pass validation.
const INVALID: u8 = 2;

/// Jobs per `GET /v1/berth/jobs` page for `berth job status`.
const JOBS_PAGE: usize = 500;

/// A job id in a query string (ids are letters, digits, `.`, `_`, `-`; anything else is
/// escaped all the same).
pub(super) fn query_escape(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'.' | b'_' | b'-' => (b as char).to_string(),
            other => format!("%{other:02X}"),
        })
        .collect()
}

/// Prints a jobspec's warnings as Nomad does, before the outcome.
fn print_warnings(warnings: impl Iterator<Item = String>) {
    let warnings: Vec<String> = warnings.collect();
    if warnings.is_empty() {
        return;
    }
    eprintln!("Job Warnings:");
    for warning in &warnings {
        eprintln!("  * {}", super::output::one_line(warning));
    }
}

/// Values for a jobspec's variables, as Nomad's CLI takes them.
#[derive(Debug, Clone, Default, clap::Args)]
pub(super) struct VarArgs {
    /// A variable's value, `name=value` (repeatable; beats -var-file and NOMAD_VAR_*).
    #[arg(long = "var", value_name = "NAME=VALUE")]
    vars: Vec<String>,
    /// A file of `name = value` lines for the jobspec's variables (repeatable, in order).
    #[arg(long = "var-file", value_name = "FILE")]
    var_files: Vec<std::path::PathBuf>,
}

/// What leaves the CLI for a jobspec: its text with every `file("…")` replaced by the
/// file's content (read here, with the user's rights, never by the agent), and the
/// values for its variables from the flags and from `NOMAD_VAR_*` in the environment.
pub(super) struct JobspecInput {
    pub name: String,
    pub source: String,
    pub inputs: VariableInputs,
}

/// Says why a jobspec does not pass, and the exit code for it.
fn invalid(error: &JobspecError) -> ExitCode {
    eprintln!(
        "Job validation failed: {}",
        super::output::text(&error.to_string())
    );
    ExitCode::from(INVALID)
}

pub(super) fn read_jobspec(path: &Path, vars: &VarArgs) -> Result<JobspecInput, JobspecError> {
    let name = path.display().to_string();
    let fail = |message: String, at: Option<jobspec::Location>| JobspecError {
        file: name.clone(),
        problems: vec![jobspec::Problem {
            path: "jobspec".into(),
            at,
            message,
        }],
    };
    let source = std::fs::read_to_string(path)
        .map_err(|e| fail(format!("cannot read the file: {e}"), None))?;
    let base = path.parent().unwrap_or(Path::new("."));
    let source = jobspec::eval::inline_files(&source, base).map_err(|problems| JobspecError {
        file: name.clone(),
        problems: problems
            .into_iter()
            .map(|p| jobspec::Problem {
                path: "jobspec".into(),
                at: Some(p.at),
                message: p.message,
            })
            .collect(),
    })?;
    let mut inputs = VariableInputs {
        env: VariableInputs::from_env(
            std::env::vars_os()
                .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?))),
        ),
        ..Default::default()
    };
    for file in &vars.var_files {
        let text = std::fs::read_to_string(file)
            .map_err(|e| fail(format!("-var-file {}: {e}", file.display()), None))?;
        inputs.files.push((file.display().to_string(), text));
    }
    for pair in &vars.vars {
        let Some((key, value)) = pair.split_once('=') else {
            return Err(fail(
                format!("-var {pair:?}: a variable is given as name=value"),
                None,
            ));
        };
        inputs.args.push((key.to_string(), value.to_string()));
    }
    Ok(JobspecInput {
        name,
        source,
        inputs,
    })
}

async fn parse_and_check(
    path: &Path,
    vars: &VarArgs,
    drivers: &DriverSet,
    hooks: &HookSet,
    config: &AgentConfig,
) -> Result<Job, JobspecError> {
    let input = read_jobspec(path, vars)?;
    let job = jobspec::parse_with(&input.name, &input.source, &input.inputs)?;
    let problems = crate::validate::validate(&job, drivers, hooks, config, None).await;
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
    vars: &VarArgs,
    drivers: &DriverSet,
    hooks: &HookSet,
    config: &AgentConfig,
) -> anyhow::Result<ExitCode> {
    match parse_and_check(path, vars, drivers, hooks, config).await {
        Ok(job) => {
            print_warnings(
                job.warnings
                    .iter()
                    .map(|w| format!("{}:{w}", path.display())),
            );
            println!(
                "Job validation successful: job {:?}, {} group(s)",
                job.name,
                job.groups.len()
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(error) => {
            eprintln!(
                "Job validation failed: {}",
                super::output::text(&error.to_string())
            );
            Ok(ExitCode::from(INVALID))
        }
    }
}

pub(super) async fn run(
    path: &Path,
    vars: &VarArgs,
    drivers: DriverSet,
    hooks: HookSet,
    config: AgentConfig,
    data_dir: &Path,
) -> anyhow::Result<ExitCode> {
    let input = match read_jobspec(path, vars) {
        Ok(input) => input,
        Err(error) => return Ok(invalid(&error)),
    };
    let agent = Agent::start(AgentOptions {
        data_dir: data_dir.to_path_buf(),
        config,
        drivers,
        hooks,
        state: StateLocation::Memory,
    })
    .await?;
    let mut events = agent.subscribe();
    let submitted = match agent
        .submit_with(&input.name, &input.source, &input.inputs)
        .await
    {
        Ok(submitted) => submitted,
        Err(SubmitError::Invalid(error)) => {
            eprintln!(
                "Job validation failed: {}",
                super::output::text(&error.to_string())
            );
            return Ok(ExitCode::from(INVALID));
        }
        Err(error) => return Err(error.into()),
    };
    print_warnings(submitted.warnings.iter().cloned());
    if submitted.alloc_ids.is_empty() {
        eprintln!(
            "Job {:?} placed no allocation: a periodic or parameterized job launches its \
             children from a running agent (start `berth agent`, then `berth job run`)",
            submitted.job_id
        );
        return Ok(ExitCode::from(INVALID));
    }
    let allocs: Vec<_> = submitted
        .alloc_ids
        .iter()
        .filter_map(|id| agent.alloc_runner(id))
        .collect();
    println!(
        "==> Running job {:?}: {} allocation(s)",
        submitted.job_id,
        allocs.len()
    );
    for alloc in &allocs {
        println!("    {} {}", alloc.id, alloc.name);
    }
    let finished = agent.wait_job(&submitted.job_id);
    tokio::pin!(finished);
    let mut interrupted = false;
    loop {
        tokio::select! {
            Ok(event) = events.recv() => print_event(&event),
            _ = &mut finished => break,
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

/// `berth job run`: submit to the running agent, then follow the allocs until each has
/// left `pending` (or a deadline passes).
pub(super) async fn submit(
    client: &Client,
    path: &Path,
    vars: &VarArgs,
    detach: bool,
) -> anyhow::Result<ExitCode> {
    let input = match read_jobspec(path, vars) {
        Ok(input) => input,
        Err(error) => return Ok(invalid(&error)),
    };
    let request = SubmitRequest {
        source_name: input.name,
        source: input.source,
        variables: input.inputs,
    };
    let submitted: Submitted = match client.post("/v1/berth/jobs", &request).await {
        Ok(submitted) => submitted,
        Err(ClientError::Api(error, status)) if status.is_client_error() => {
            eprintln!(
                "Job validation failed: {}",
                super::output::text(&error.error)
            );
            for problem in &error.problems {
                eprintln!("  {}", super::output::one_line(problem));
            }
            return Ok(ExitCode::from(INVALID));
        }
        Err(error) => return Err(error.into()),
    };
    print_warnings(submitted.warnings.iter().cloned());
    println!("==> Job {:?} submitted", submitted.job_id);
    if !submitted.replaced.is_empty() {
        println!(
            "    replaced the previous version: stopped {}",
            submitted.replaced.join(", ")
        );
    }
    for id in &submitted.alloc_ids {
        println!("    alloc {id}");
    }
    if detach {
        return Ok(ExitCode::SUCCESS);
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut failed = false;
    for id in &submitted.alloc_ids {
        let status = loop {
            let status: AllocStatus = client.get(&format!("/v1/berth/allocation/{id}")).await?;
            let settled = status.client_status != ClientStatus::Pending
                && status
                    .tasks
                    .values()
                    .all(|t| t.state != TaskStateKind::Pending || t.failed);
            if settled || tokio::time::Instant::now() >= deadline {
                break status;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        failed |= status.client_status == ClientStatus::Failed;
        println!(
            "==> {} {}: {:?}",
            status.name, status.id, status.client_status
        );
        for (name, task) in &status.tasks {
            let last = task.events.last().map(|e| e.message.as_str()).unwrap_or("");
            println!(
                "    {name:<16} {:<8} {last}",
                format!("{:?}", task.state).to_lowercase()
            );
        }
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

pub(super) async fn status(client: &Client, id: Option<&str>) -> anyhow::Result<ExitCode> {
    let Some(id) = id else {
        // Page through, so that no single answer holds every job the agent keeps.
        let mut jobs: Vec<JobStatus> = Vec::new();
        let mut next: Option<String> = None;
        loop {
            let path = match &next {
                Some(token) => format!(
                    "/v1/berth/jobs?per_page={JOBS_PAGE}&next_token={}",
                    query_escape(token)
                ),
                None => format!("/v1/berth/jobs?per_page={JOBS_PAGE}"),
            };
            let (page, token): (Vec<JobStatus>, _) = client.get_page(&path).await?;
            jobs.extend(page);
            match token {
                Some(token) if next.as_ref() != Some(&token) => next = Some(token),
                _ => break,
            }
        }
        if jobs.is_empty() {
            println!("No jobs");
            return Ok(ExitCode::SUCCESS);
        }
        println!("{:<24} {:<8} {:<8} Allocs", "ID", "Type", "Status");
        for job in jobs {
            println!(
                "{:<24} {:<8} {:<8} {}",
                job.id,
                format!("{:?}", job.job_type).to_lowercase(),
                status_word(&job),
                job.allocs.len()
            );
        }
        return Ok(ExitCode::SUCCESS);
    };
    let job: JobStatus = client
        .get(&format!("/v1/berth/job/{}", query_escape(id)))
        .await?;
    println!("ID        = {}", job.id);
    println!(
        "Type      = {}",
        format!("{:?}", job.job_type).to_lowercase()
    );
    println!("Status    = {}", status_word(&job));
    if let Some(launches) = &job.launches {
        println!("{:<9} = true (it launches child jobs)", launches.as_str());
    }
    if let Some(parent) = &job.parent {
        println!("Parent    = {parent}");
    }
    println!(
        "Submitted = {} (from {})",
        clock(job.submitted_ms),
        one_line(&job.source_name)
    );
    println!();
    println!("Allocations");
    println!("{:<36}  {:<16} {:<8} Status", "ID", "Name", "Desired");
    for alloc in &job.allocs {
        println!(
            "{:<36}  {:<16} {:<8} {}",
            alloc.id,
            alloc.name,
            format!("{:?}", alloc.desired_status).to_lowercase(),
            format!("{:?}", alloc.client_status).to_lowercase()
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn status_word(job: &JobStatus) -> String {
    let state = format!("{:?}", job.status).to_lowercase();
    if job.stopped {
        format!("{state} (stopped)")
    } else {
        state
    }
}

pub(super) async fn stop(client: &Client, id: &str) -> anyhow::Result<ExitCode> {
    let stopped: Stopped = client
        .delete(&format!("/v1/berth/job/{}", query_escape(id)))
        .await?;
    if stopped.stopping.is_empty() {
        println!("==> Job {:?} stopped; no alloc was running", stopped.job_id);
    } else {
        println!(
            "==> Job {:?} stopping {} alloc(s): {}",
            stopped.job_id,
            stopped.stopping.len(),
            stopped.stopping.join(", ")
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `berth job dispatch`: the meta as KEY=VALUE, the payload from a file or stdin.
pub(super) async fn dispatch(
    client: &Client,
    id: &str,
    meta: &[String],
    input: Option<&Path>,
) -> anyhow::Result<ExitCode> {
    use base64::Engine as _;
    let mut request = crate::api::DispatchRequest::default();
    for pair in meta {
        let Some((key, value)) = pair.split_once('=') else {
            eprintln!("Error: -meta {pair:?} is not KEY=VALUE");
            return Ok(ExitCode::from(INVALID));
        };
        request.meta.insert(key.to_string(), value.to_string());
    }
    if let Some(input) = input {
        let bytes = if input == Path::new("-") {
            let mut bytes = Vec::new();
            std::io::Read::read_to_end(&mut std::io::stdin(), &mut bytes)
                .context("reading the payload from standard input")?;
            bytes
        } else {
            std::fs::read(input).with_context(|| format!("reading {}", input.display()))?
        };
        request.payload = Some(base64::engine::general_purpose::STANDARD.encode(bytes));
    }
    let path = format!("/v1/berth/job/{}/dispatch", query_escape(id));
    let launched: Submitted = match client.post(&path, &request).await {
        Ok(launched) => launched,
        Err(ClientError::Api(error, _)) => {
            eprintln!("Error: {}", super::output::text(&error.error));
            return Ok(ExitCode::from(INVALID));
        }
        Err(error) => return Err(error.into()),
    };
    println!("Dispatched Job ID = {}", launched.job_id);
    for alloc in &launched.alloc_ids {
        println!("    alloc {alloc}");
    }
    Ok(ExitCode::SUCCESS)
}

/// `berth job periodic force`.
pub(super) async fn force_periodic(client: &Client, id: &str) -> anyhow::Result<ExitCode> {
    let path = format!("/v1/berth/job/{}/periodic/force", query_escape(id));
    let launched: Submitted = match client.post(&path, &serde_json::json!({})).await {
        Ok(launched) => launched,
        Err(ClientError::Api(error, _)) => {
            eprintln!("Error: {}", super::output::text(&error.error));
            return Ok(ExitCode::from(INVALID));
        }
        Err(error) => return Err(error.into()),
    };
    println!("Launched Job ID = {}", launched.job_id);
    for alloc in &launched.alloc_ids {
        println!("    alloc {alloc}");
    }
    Ok(ExitCode::SUCCESS)
}

fn print_log(alloc: &str, task: &str, stream: &str, path: &Path) {
    let Ok(text) = std::fs::read_to_string(path) else {
        return;
    };
    if text.is_empty() {
        return;
    }
    println!("--- {alloc} {task} {stream} ({}) ---", path.display());
    print!("{}", super::output::text(&text));
    if !text.ends_with('\n') {
        println!();
    }
}
