//! `berth job validate|run|status|stop|dispatch|periodic force` and `berth run`: a one-shot embedded agent (state
//! in memory) that runs a job, streams its events as they happen, prints the tasks'
//! output and exits with the job's outcome.

use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;

use super::nomad_shapes::{Alloc, JobRead, JobStub, capitalized, job_allocs, path_escape};
use super::output::{clock, eprint_line, one_line, print_event, print_line};
use berth_api::client::{Client, ClientError};
use berth_api::nomad::submission::{
    BerthSource, JobPlanRequest, JobRegisterRequest, JobSubmission, ParseRequest,
};
use berth_client::agent::{Agent, AgentOptions, StateLocation, SubmitError, Submitted};
use berth_client::config::AgentConfig;
use berth_client::driver_set::DriverSet;
use berth_client::hook_set::HookSet;
use berth_hcl::eval::VariableInputs;
use berth_jobspec::{Job, JobspecError};
use berth_model::status::ClientStatus;
use berth_nomad_api::evals::{AllocationMetric, Evaluation};
use berth_nomad_api::jobs::{
    self as nomad_jobs, JobDispatchResponse, JobPlanResponse, JobRegisterResponse,
};

/// Exit code for a jobspec that does not pass validation.
const INVALID: u8 = 2;

pub(super) use super::output::query_escape;

/// Prints a jobspec's warnings as Nomad does, before the outcome.
fn print_warnings(warnings: impl Iterator<Item = String>) {
    let warnings: Vec<String> = warnings.collect();
    if warnings.is_empty() {
        return;
    }
    eprint_line!("Job Warnings:");
    for warning in &warnings {
        eprint_line!("  * {}", super::output::one_line(warning));
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
    super::output::print_problems("Job validation failed: ", error);
    ExitCode::from(INVALID)
}

pub(super) fn read_jobspec(path: &Path, vars: &VarArgs) -> Result<JobspecInput, JobspecError> {
    let name = path.display().to_string();
    let fail = |message: String, at: Option<berth_hcl::Location>| JobspecError {
        file: name.clone(),
        problems: vec![berth_hcl::Problem {
            path: "jobspec".into(),
            at,
            message,
        }],
    };
    let source = std::fs::read_to_string(path)
        .map_err(|e| fail(format!("cannot read the file: {e}"), None))?;
    let base = path.parent().unwrap_or(Path::new("."));
    let source = berth_hcl::eval::inline_files(&source, base).map_err(|problems| JobspecError {
        file: name.clone(),
        problems: problems
            .into_iter()
            .map(|p| berth_hcl::Problem {
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
    let job = berth_jobspec::parse_with(&input.name, &input.source, &input.inputs)?;
    // Checked offline, for the node this config describes.
    let facts = berth_client::node::facts(&berth_client::node::Identity {
        name: config.name.clone(),
        datacenter: config.datacenter.clone(),
        ephemeral_disk_limit: None,
    });
    let problems =
        berth_client::validate::validate(&job, drivers, hooks, config, None, &facts).await;
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
            print_line!(
                "Job validation successful: job {:?}, {} group(s)",
                job.name,
                job.groups.len()
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(error) => {
            super::output::print_problems("Job validation failed: ", &error);
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
            super::output::print_problems("Job validation failed: ", &error);
            return Ok(ExitCode::from(INVALID));
        }
        Err(error) => return Err(error.into()),
    };
    print_warnings(submitted.warnings.iter().cloned());
    if submitted.alloc_ids.is_empty() {
        eprint_line!(
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
    print_line!(
        "==> Running job {:?}: {} allocation(s)",
        submitted.job_id,
        allocs.len()
    );
    for alloc in &allocs {
        print_line!("    {} {}", alloc.id, alloc.name);
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
                print_line!("==> Interrupted: stopping the allocations");
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
        print_line!(
            "==> {} {}: {:?}",
            alloc.name,
            alloc.id,
            status.client_status
        );
    }
    // The agent's state dies with this command: its allocs go with it, their disks (a
    // mounted image each) above all. Their output is printed above.
    let ids: Vec<String> = allocs.iter().map(|alloc| alloc.id.clone()).collect();
    let collected = agent.collect_now(&ids);
    if collected.len() < ids.len() {
        eprint_line!(
            "==> {} of {} allocation(s) could not be removed (see the log above): their \
             directories stay under {}",
            ids.len() - collected.len(),
            ids.len(),
            data_dir.join("allocs").display()
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

/// What `POST /v1/jobs/parse` is sent for a jobspec read by the CLI: Nomad's request,
/// with berth's addition (the file's name and the variables as read here).
fn parse_request(input: &JobspecInput) -> ParseRequest {
    ParseRequest {
        job_hcl: input.source.clone(),
        variables: String::new(),
        canonicalize: true,
        berth: Some(berth_source(input)),
    }
}

fn berth_source(input: &JobspecInput) -> BerthSource {
    BerthSource {
        source_name: input.name.clone(),
        variables: input.inputs.clone(),
    }
}

/// The jobspec as Nomad's job JSON (`POST /v1/jobs/parse`), or the exit code of a
/// jobspec that does not parse.
async fn parse_on_agent(
    client: &Client,
    input: &JobspecInput,
) -> anyhow::Result<Result<nomad_jobs::Job, ExitCode>> {
    match client.post("/v1/jobs/parse", &parse_request(input)).await {
        Ok(job) => Ok(Ok(job)),
        Err(ClientError::Api(error, status)) if status.is_client_error() => {
            Ok(Err(refused_jobspec(&error)))
        }
        Err(error) => Err(error.into()),
    }
}

/// Says why the agent refused a jobspec, and the exit code for it.
fn refused_jobspec(error: &berth_api::ApiError) -> ExitCode {
    super::output::print_refusal("Job validation failed: ", error);
    ExitCode::from(INVALID)
}

/// `berth job run`: the jobspec parsed by the agent (`POST /v1/jobs/parse`, with the
/// CLI's variables), registered as job JSON with its source (`PUT /v1/jobs`, as Nomad's
/// CLI does), then its allocs followed until each has left `pending` (or a deadline
/// passes).
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
    let job = match parse_on_agent(client, &input).await? {
        Ok(job) => job,
        Err(code) => return Ok(code),
    };
    let job_id = job.id.clone();
    let before = job_allocs(client, &job_id).await?;
    let request = JobRegisterRequest {
        job,
        submission: Some(JobSubmission {
            source: input.source.clone(),
            format: "hcl2".into(),
            variable_flags: input.inputs.args.iter().cloned().collect(),
            variables: String::new(),
            berth: Some(berth_source(&input)),
        }),
    };
    let registered: JobRegisterResponse = match client.put("/v1/jobs", &request).await {
        Ok(registered) => registered,
        Err(ClientError::Api(error, status)) if status.is_client_error() => {
            return Ok(refused_jobspec(&error));
        }
        Err(error) => return Err(error.into()),
    };
    print_warnings(
        registered
            .warnings
            .lines()
            .filter(|w| !w.is_empty())
            .map(str::to_string),
    );
    let eval_id = registered.eval_id;
    let evaluated = follow_evaluation(client, &eval_id).await?;
    let (after, failed) = match evaluated {
        Some(evaluation) => (evaluation.allocs, Some(evaluation.failed)),
        None => (job_allocs(client, &job_id).await?, None),
    };
    let new_ids: Vec<String> = after
        .iter()
        .filter(|a| !before.iter().any(|b| b.id == a.id))
        .map(|a| a.id.clone())
        .collect();
    let replaced: Vec<&str> = before
        .iter()
        .filter(|a| a.is_live())
        .map(|a| a.id.as_str())
        .collect();
    print_line!("==> Job {:?} submitted", job_id);
    if !replaced.is_empty() {
        print_line!(
            "    replaced the previous version: stopped {}",
            replaced.join(", ")
        );
    }
    for id in &new_ids {
        print_line!("    alloc {}", id);
    }
    let unplaced = failed
        .flatten()
        .is_some_and(|failed| super::placement::print_after_run(&eval_id, &failed));
    if detach {
        return Ok(if unplaced {
            ExitCode::from(2)
        } else {
            ExitCode::SUCCESS
        });
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut failed = false;
    for id in &new_ids {
        let alloc = loop {
            let alloc: Alloc = client
                .get(&format!("/v1/allocation/{}", path_escape(id)))
                .await?;
            let settled = alloc.client_status != "pending"
                && alloc
                    .task_states
                    .values()
                    .all(|t| t.state != "pending" || t.failed);
            if settled || tokio::time::Instant::now() >= deadline {
                break alloc;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        failed |= alloc.client_status == "failed";
        print_line!(
            "==> {} {}: {}",
            alloc.name,
            alloc.id,
            capitalized(&alloc.client_status)
        );
        for (name, task) in &alloc.task_states {
            let last = task
                .events
                .last()
                .map(|e| e.display_message.as_str())
                .unwrap_or("");
            print_line!("    {:<16} {:<8} {}", name, task.state, last);
        }
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else if unplaced {
        // Nomad's `job run` exits 2 when allocs could not be placed.
        ExitCode::from(2)
    } else {
        ExitCode::SUCCESS
    })
}

/// What a register's evaluation decided, once it was.
struct Evaluated {
    allocs: Vec<Alloc>,
    /// `FailedTGAllocs`: per group, what ruled out or filled the nodes.
    failed: Option<std::collections::BTreeMap<String, AllocationMetric>>,
}

/// Follows evaluation `eval_id` (Nomad's `EvalID`) until the scheduler completed it,
/// for 30 s at most, as `nomad job run` monitors it: its allocs and what it could not
/// place. `None` without an evaluation, or when it did not complete in time.
async fn follow_evaluation(client: &Client, eval_id: &str) -> anyhow::Result<Option<Evaluated>> {
    if eval_id.is_empty() {
        return Ok(None);
    }
    let path = format!("/v1/evaluation/{}", path_escape(eval_id));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let evaluation: Evaluation = client.get(&path).await?;
        if evaluation.status != "pending" {
            let allocs: Vec<Alloc> = client.get(&format!("{path}/allocations")).await?;
            return Ok(Some(Evaluated {
                allocs,
                failed: evaluation.failed_tg_allocs,
            }));
        }
        if tokio::time::Instant::now() >= deadline {
            print_line!(
                "    evaluation {} is still pending: follow it with `berth job status`",
                eval_id
            );
            return Ok(None);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `berth job plan`: what `berth job run` would do here (`POST /v1/job/:id/plan`), as
/// Nomad's CLI shows it. Exits 0 when nothing would change, 1 when allocs would be
/// placed, replaced or stopped (Nomad's codes), 2 for a jobspec that does not pass.
pub(super) async fn plan(client: &Client, path: &Path, vars: &VarArgs) -> anyhow::Result<ExitCode> {
    let input = match read_jobspec(path, vars) {
        Ok(input) => input,
        Err(error) => return Ok(invalid(&error)),
    };
    let job = match parse_on_agent(client, &input).await? {
        Ok(job) => job,
        Err(code) => return Ok(code),
    };
    let job_id = job.id.clone();
    let request = JobPlanRequest {
        job,
        diff: true,
        submission: Some(JobSubmission {
            source: input.source.clone(),
            format: "hcl2".into(),
            variable_flags: input.inputs.args.iter().cloned().collect(),
            variables: String::new(),
            berth: Some(berth_source(&input)),
        }),
    };
    let plan: JobPlanResponse = match client
        .post(&format!("/v1/job/{}/plan", path_escape(&job_id)), &request)
        .await
    {
        Ok(plan) => plan,
        Err(ClientError::Api(error, status)) if status.is_client_error() => {
            return Ok(refused_jobspec(&error));
        }
        Err(error) => return Err(error.into()),
    };
    let sign = |kind: &str| match kind {
        "Added" => "+",
        "Deleted" => "-",
        "Edited" => "+/-",
        _ => " ",
    };
    let diff = plan.diff.unwrap_or_default();
    print_line!("{} Job: {:?}", sign(&diff.kind), job_id);
    let updates = &plan.annotations.desired_tg_updates;
    let mut changes = false;
    for group in &diff.task_groups {
        let name = group.name.as_str();
        let counts = updates.get(name).cloned().unwrap_or_default();
        let mut said = Vec::new();
        for (count, word) in [
            (counts.place, "create"),
            (counts.destructive_update, "create/destroy update"),
            (counts.stop, "destroy"),
        ] {
            if count > 0 {
                changes = true;
                said.push(format!("{count} {word}"));
            }
        }
        let said = if said.is_empty() {
            String::new()
        } else {
            format!(" ({})", said.join(", "))
        };
        print_line!("{} Task Group: {:?}{}", sign(&group.kind), name, said);
    }
    print_line!();
    print_line!("Scheduler dry-run:");
    match &plan.failed_tg_allocs {
        Some(failed) if !failed.is_empty() => {
            print_line!("- WARNING: Failed to place all allocations.");
            for (group, metric) in failed {
                print_line!("  Task Group {:?} (failed to place):", group);
                for problem in metric.constraint_filtered.keys() {
                    print_line!("    * {}", one_line(problem));
                }
            }
        }
        _ => print_line!("- All tasks successfully allocated."),
    }
    if let Some(next) = Some(plan.next_periodic_launch.as_str())
        .filter(|t| !t.is_empty() && !t.starts_with("0001-"))
    {
        print_line!(
            "- If submitted now, next periodic launch would be at {} (UTC).",
            next
        );
    }
    print_warnings(
        plan.warnings
            .lines()
            .filter(|w| !w.is_empty())
            .map(str::to_string),
    );
    Ok(if changes {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

pub(super) async fn status(client: &Client, id: Option<&str>) -> anyhow::Result<ExitCode> {
    let Some(id) = id else {
        let jobs: Vec<JobStub> = client.get("/v1/jobs").await?;
        if jobs.is_empty() {
            print_line!("No jobs");
            return Ok(ExitCode::SUCCESS);
        }
        let allocs: Vec<Alloc> = client.get("/v1/allocations").await?;
        print_line!("{:<24} {:<8} {:<8} Allocs", "ID", "Type", "Status");
        for job in jobs {
            print_line!(
                "{:<24} {:<8} {:<8} {}",
                job.id,
                job.job_type,
                status_word(&job.status, job.stop),
                allocs.iter().filter(|a| a.job_id == job.id).count()
            );
        }
        return Ok(ExitCode::SUCCESS);
    };
    let job: JobRead = client.get(&format!("/v1/job/{}", path_escape(id))).await?;
    print_line!("ID        = {}", job.id);
    print_line!("Type      = {}", job.job_type);
    print_line!("Status    = {}", status_word(&job.status, job.stop));
    let launches = if job.periodic.is_some() {
        Some("periodic")
    } else if job.parameterized_job.is_some() {
        Some("parameterized")
    } else {
        None
    };
    if let Some(launches) = launches {
        print_line!("{:<9} = true (it launches child jobs)", launches);
    }
    if !job.parent_id.is_empty() {
        print_line!("Parent    = {}", job.parent_id);
    }
    print_line!("Submitted = {}", clock(job.submit_time / 1_000_000));
    print_line!();
    print_line!("Allocations");
    print_line!(
        "{:<36}  {:<16} {:<12} {:<8} Status",
        "ID",
        "Name",
        "Node",
        "Desired"
    );
    for alloc in job_allocs(client, &job.id).await? {
        print_line!(
            "{:<36}  {:<16} {:<12} {:<8} {}",
            alloc.id,
            super::output::one_line(&alloc.name),
            super::output::one_line(&alloc.node_name),
            alloc.desired_status,
            alloc.client_status
        );
    }
    super::placement::print_latest(client, &job.id).await?;
    Ok(ExitCode::SUCCESS)
}

fn status_word(status: &str, stopped: bool) -> String {
    if stopped {
        format!("{status} (stopped)")
    } else {
        status.to_string()
    }
}

/// `berth job stop`: `DELETE /v1/job/:id`; the allocs it stops are those that were live.
pub(super) async fn stop(client: &Client, id: &str) -> anyhow::Result<ExitCode> {
    let path = format!("/v1/job/{}", path_escape(id));
    // Nomad's 404 says "job not found": name the job, as berth's CLI always has.
    let before: Vec<Alloc> = match client.get::<JobRead>(&path).await {
        Ok(_) => job_allocs(client, id).await?,
        Err(ClientError::Api(_, status)) if status.as_u16() == 404 => {
            anyhow::bail!("no job matches {id:?}")
        }
        Err(error) => return Err(error.into()),
    };
    let _: nomad_jobs::JobDeregisterResponse = client.delete(&path).await?;
    let stopping: Vec<&str> = before
        .iter()
        .filter(|a| a.is_live())
        .map(|a| a.id.as_str())
        .collect();
    if stopping.is_empty() {
        print_line!("==> Job {:?} stopped; no alloc was running", id);
    } else {
        print_line!(
            "==> Job {:?} stopping {} alloc(s): {}",
            id,
            stopping.len(),
            stopping.join(", ")
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `berth job dispatch`: the meta as KEY=VALUE, the payload from a file or stdin
/// (`POST /v1/job/:id/dispatch`).
pub(super) async fn dispatch(
    client: &Client,
    id: &str,
    meta: &[String],
    input: Option<&Path>,
) -> anyhow::Result<ExitCode> {
    use base64::Engine as _;
    let mut request = berth_nomad_api::jobs::JobDispatchRequest::default();
    for pair in meta {
        let Some((key, value)) = pair.split_once('=') else {
            eprint_line!("Error: -meta {:?} is not KEY=VALUE", pair);
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
    let path = format!("/v1/job/{}/dispatch", path_escape(id));
    let launched: JobDispatchResponse = match client.post(&path, &request).await {
        Ok(launched) => launched,
        // Nomad's 404 says "job not found": name the job, as berth's CLI always has.
        Err(ClientError::Api(_, status)) if status.as_u16() == 404 => {
            eprint_line!("Error: no job matches {:?}", id);
            return Ok(ExitCode::from(INVALID));
        }
        Err(ClientError::Api(error, _)) => {
            super::output::print_refusal("Error: ", &error);
            return Ok(ExitCode::from(INVALID));
        }
        Err(error) => return Err(error.into()),
    };
    let child = &launched.dispatched_job_id;
    print_line!("Dispatched Job ID = {}", child);
    for alloc in job_allocs(client, child).await? {
        print_line!("    alloc {}", alloc.id);
    }
    Ok(ExitCode::SUCCESS)
}

/// `berth job periodic force`.
pub(super) async fn force_periodic(client: &Client, id: &str) -> anyhow::Result<ExitCode> {
    let path = format!("/v1/berth/job/{}/periodic/force", query_escape(id));
    let launched: Submitted = match client.post(&path, &berth_nomad_api::Empty {}).await {
        Ok(launched) => launched,
        Err(ClientError::Api(error, _)) => {
            super::output::print_refusal("Error: ", &error);
            return Ok(ExitCode::from(INVALID));
        }
        Err(error) => return Err(error.into()),
    };
    print_line!("Launched Job ID = {}", launched.job_id);
    for alloc in &launched.alloc_ids {
        print_line!("    alloc {}", alloc);
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
    print_line!("--- {} {} {} ({}) ---", alloc, task, stream, path.display());
    super::output::print_text(&text);
}
