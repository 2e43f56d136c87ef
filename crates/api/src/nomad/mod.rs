//! Nomad's HTTP API on berth: the paths, JSON shapes, status codes and headers of
//! Nomad's documentation, so Nomad's tools (client libraries, `curl` examples,
//! dashboards) work against a berth agent, which is a one-node cluster: its own server,
//! in region `global`, namespace `default`.
//!
//! Every read answers with `X-Nomad-Index` (the agent's change index) and is a
//! blocking query with `?index=N&wait=D` (default 5 minutes, at most 10): it answers
//! once the index is past `N` (with more than 256 waiting at once, a second at most).
//! Errors are Nomad's: a status code and a plain-text body. Streams (a log followed,
//! the event stream) are capped at 128 open at once (`streams.rs`; past it 429).
//!
//! | method | path |
//! |---|---|
//! | GET | `/v1/jobs` (`?prefix=`) |
//! | PUT, POST | `/v1/jobs` (register `{"Job": {...}}`) |
//! | POST | `/v1/jobs/parse` (`{"JobHCL": "...", "Variables": "...", "Canonicalize": true}`, `submission.rs`) |
//! | POST | `/v1/validate/job` |
//! | GET, DELETE | `/v1/job/:id` (`?purge=true`) |
//! | PUT, POST | `/v1/job/:id` (register) |
//! | GET | `/v1/job/:id/allocations`, `/v1/job/:id/summary`, `/v1/job/:id/versions` |
//! | POST, PUT | `/v1/job/:id/plan` (`{"Job": {...}, "Diff": true}`: a dry run here, `job_actions.rs`) |
//! | POST, PUT | `/v1/job/:id/dispatch` (`{"Payload": base64, "Meta": {...}}`, `job_actions.rs`) |
//! | GET | `/v1/job/:id/evaluations`, `/v1/evaluations` (`prefix`, `job`, `status`), |
//! |     | `/v1/evaluation/:id`, `/v1/evaluation/:id/allocations` (`evaluations.rs`) |
//! | GET | `/v1/job/:id/deployments` (always empty: berth has no deployments) |
//! | GET | `/v1/allocations`, `/v1/allocation/:id` |
//! | POST, PUT | `/v1/allocation/:id/stop` |
//! | GET | `/v1/nodes`, `/v1/node/:id`, `/v1/node/:id/allocations` |
//! | POST, PUT | `/v1/client/allocation/:alloc_id/restart`, `/v1/client/allocation/:alloc_id/signal` (see [`alloc_actions`]) |
//! | GET | `/v1/client/allocation/:alloc_id/stats`, `/v1/client/stats` (from cgroups and `/proc`; see [`stats`]) |
//! | GET | `/v1/client/fs/logs/:alloc_id` (`task`, `type`, `origin`, `offset`, `plain`, `follow`: a stream, `follow_logs.rs`) |
//! | GET | `/v1/client/fs/ls/:alloc_id`, `/v1/client/fs/stat/:alloc_id`, `/v1/client/fs/cat/:alloc_id`, |
//! |     | `/v1/client/fs/readat/:alloc_id` (`path`; `offset`, `limit`): Nomad's view of berth's alloc dir, no link followed (`alloc_fs.rs`) |
//! | GET | `/v1/event/stream` (`topic=Topic:Key`, `index`): a stream (`event_stream.rs`) |
//! | GET | `/v1/volumes?type=csi` (`plugin_id`, `prefix`), `/v1/volume/csi/:id` (see [`csi`]) |
//! | PUT, POST | `/v1/volume/csi/:id` (register `{"Volumes": [{...}]}`), `/v1/volume/csi/:id/create` |
//! | DELETE | `/v1/volume/csi/:id` (`?force=true`: drop finished allocs' claims first) |
//! | GET | `/v1/plugins?type=csi`, `/v1/plugin/csi/:id` |
//! | GET | `/v1/metrics` (go-metrics JSON; `?format=prometheus`: Prometheus' text; see [`metrics`]) |
//! | GET | `/v1/agent/self`, `/v1/agent/health`, `/v1/status/leader`, `/v1/status/peers`, `/v1/regions` |
//! | POST, PUT | `/v1/node/:id/eligibility`, `/v1/node/:id/drain` (a cluster's nodes; see [`cluster`]) |
//!
//! In a cluster (`cluster { store = "etcd" }`), nodes, allocs and the leader are the
//! cluster's, from any agent, and `X-Nomad-Index` is etcd's revision (`cluster.rs`).
//!
//! One API: berth's CLI uses these paths for everything Nomad has a path for (`job run`
//! is parse + register with its source as `Submission`, `job plan|status|stop|dispatch`,
//! `alloc status|logs`). Under `/v1/berth/` (`crates/api/src/lib.rs`) stays what Nomad has no path
//! for: driver and hook lists, `system gc`, `periodic force` (Nomad's answer has no child
//! id), services, volumes and plugins in berth's shapes, and an alloc's dir, disk use and
//! mounts with their host paths. berth's own job and alloc paths are still served, for
//! the tests and tools written against them.

pub mod alloc_actions;
pub mod alloc_fs;
mod cluster;
pub mod csi;
mod evaluations;
mod event_stream;
mod follow_logs;
mod job_actions;
pub mod metrics;
pub mod register;
mod reschedule;
pub mod shapes;
pub mod stats;
mod streams;
pub mod submission;

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};
use serde::Deserialize;
use serde_json::{Value, json};

use berth_client::agent::{Agent, LookupError, Submitter};
use shapes::ThisNode;

/// The longest wait of a blocking query, as Nomad's.
const MAX_WAIT: Duration = Duration::from_secs(600);
const DEFAULT_WAIT: Duration = Duration::from_secs(300);
/// How long a blocking query waits at most when
/// [`MAX_WAITING`](berth_client::agent::api_places::MAX_WAITING) wait already.
const CROWDED_WAIT: Duration = Duration::from_secs(1);

/// A Nomad-style error: the status and a plain-text body.
#[derive(Debug, thiserror::Error)]
#[error("{1}")]
pub struct NomadError(StatusCode, String);

impl IntoResponse for NomadError {
    fn into_response(self) -> Response {
        (
            self.0,
            [("content-type", "text/plain; charset=utf-8")],
            self.1,
        )
            .into_response()
    }
}

impl From<LookupError> for NomadError {
    fn from(error: LookupError) -> Self {
        match error {
            LookupError::NotFound { kind, .. } => {
                NomadError(StatusCode::NOT_FOUND, format!("{kind} not found"))
            }
            refused @ (LookupError::Ambiguous { .. } | LookupError::Unreadable { .. }) => {
                NomadError(StatusCode::BAD_REQUEST, refused.to_string())
            }
            LookupError::Cluster(error) => {
                NomadError(StatusCode::SERVICE_UNAVAILABLE, error.to_string())
            }
        }
    }
}

impl From<berth_client::agent::NotOwner> for NomadError {
    fn from(refused: berth_client::agent::NotOwner) -> Self {
        NomadError(StatusCode::FORBIDDEN, refused.to_string())
    }
}

impl From<berth_client::agent::StopError> for NomadError {
    fn from(error: berth_client::agent::StopError) -> Self {
        match error {
            berth_client::agent::StopError::Lookup(lookup) => NomadError::from(lookup),
            berth_client::agent::StopError::NotOwner(refused) => NomadError::from(refused),
        }
    }
}

fn bad_request(message: impl Into<String>) -> NomadError {
    NomadError(StatusCode::BAD_REQUEST, message.into())
}

/// `?index=` and `?wait=` of a blocking query.
#[derive(Debug, Default, Deserialize)]
pub struct Blocking {
    index: Option<String>,
    wait: Option<String>,
}

impl Blocking {
    fn parse(&self) -> Result<Option<(u64, Duration)>, NomadError> {
        let Some(index) = self.index.as_deref().filter(|i| !i.is_empty()) else {
            return Ok(None);
        };
        let index: u64 = index
            .parse()
            .map_err(|_| bad_request(format!("Invalid index: {index:?} is not a number")))?;
        let wait = match self.wait.as_deref().filter(|w| !w.is_empty()) {
            None => DEFAULT_WAIT,
            Some(text) => {
                // Nomad takes a Go duration; a bare number is seconds.
                let wait = match text.parse::<u64>() {
                    Ok(seconds) => Duration::from_secs(seconds),
                    Err(_) => berth_model::units::parse_duration(text)
                        .map_err(|e| bad_request(format!("Invalid wait time: {e}")))?,
                };
                wait.min(MAX_WAIT)
            }
        };
        Ok(Some((index, wait)))
    }

    /// Waits as the query asks, then answers with the index in Nomad's headers.
    async fn answer(
        &self,
        agent: &Agent,
        make: impl FnOnce() -> Result<Value, NomadError>,
    ) -> Response {
        let index = match self.parse() {
            Err(error) => return error.into_response(),
            Ok(None) => agent.change_index().current(),
            Ok(Some((index, wait))) => {
                let place = agent.api_places().waiting.enter();
                let wait = if place.is_some() {
                    wait
                } else {
                    wait.min(CROWDED_WAIT)
                };
                let index = agent.change_index().wait_past(index, wait).await;
                drop(place);
                index
            }
        };
        match make() {
            Ok(value) => with_index(axum::Json(value).into_response(), index),
            Err(error) => with_index(error.into_response(), index),
        }
    }
}

fn with_index(mut response: Response, index: u64) -> Response {
    let headers = response.headers_mut();
    headers.insert("x-nomad-index", HeaderValue::from(index));
    headers.insert("x-nomad-knownleader", HeaderValue::from_static("true"));
    headers.insert("x-nomad-lastcontact", HeaderValue::from_static("0"));
    response
}

/// Nomad's paths, beside berth's own under `/v1/berth/`.
pub fn router() -> Router<Arc<Agent>> {
    Router::new()
        .route(
            "/v1/jobs",
            get(cluster::list_jobs).put(register).post(register),
        )
        .route(
            "/v1/jobs/parse",
            post(submission::parse).put(submission::parse),
        )
        .route("/v1/validate/job", post(validate_job).put(validate_job))
        .route(
            "/v1/job/{id}",
            get(cluster::read_job)
                .delete(deregister_job)
                .put(register_at)
                .post(register_at),
        )
        .route("/v1/job/{id}/allocations", get(cluster::job_allocations))
        .route(
            "/v1/job/{id}/plan",
            post(job_actions::plan).put(job_actions::plan),
        )
        .route(
            "/v1/job/{id}/dispatch",
            post(job_actions::dispatch).put(job_actions::dispatch),
        )
        .route("/v1/job/{id}/summary", get(job_summary))
        .route("/v1/job/{id}/versions", get(job_versions))
        .route("/v1/job/{id}/evaluations", get(evaluations::of_job))
        .route("/v1/evaluations", get(evaluations::list))
        .route("/v1/evaluation/{id}", get(evaluations::read))
        .route(
            "/v1/evaluation/{id}/allocations",
            get(evaluations::allocations),
        )
        .route("/v1/job/{id}/deployments", get(job_none))
        .route("/v1/allocations", get(cluster::list_allocations))
        .route("/v1/allocation/{id}", get(read_allocation))
        .route(
            "/v1/allocation/{id}/stop",
            post(stop_allocation).put(stop_allocation),
        )
        .route("/v1/nodes", get(cluster::list_nodes))
        .route("/v1/node/{id}", get(cluster::read_node))
        .route("/v1/node/{id}/allocations", get(cluster::node_allocations))
        .route(
            "/v1/node/{id}/eligibility",
            post(cluster::node_eligibility).put(cluster::node_eligibility),
        )
        .route(
            "/v1/node/{id}/drain",
            post(cluster::node_drain).put(cluster::node_drain),
        )
        .route(
            "/v1/client/allocation/{id}/restart",
            post(alloc_actions::restart).put(alloc_actions::restart),
        )
        .route(
            "/v1/client/allocation/{id}/signal",
            post(alloc_actions::signal).put(alloc_actions::signal),
        )
        .route("/v1/client/allocation/{id}/stats", get(stats::alloc_stats))
        .route("/v1/client/stats", get(stats::host_stats))
        .route("/v1/client/fs/logs/{alloc}", get(task_logs))
        .route("/v1/client/fs/ls/{alloc}", get(alloc_fs::list))
        .route("/v1/client/fs/stat/{alloc}", get(alloc_fs::stat))
        .route("/v1/client/fs/cat/{alloc}", get(alloc_fs::cat))
        .route("/v1/client/fs/readat/{alloc}", get(alloc_fs::read_at))
        .route("/v1/event/stream", get(event_stream::stream))
        .route("/v1/volumes", get(csi::list_volumes))
        .route(
            "/v1/volume/csi/{id}",
            get(csi::read_volume)
                .put(csi::register_volume)
                .post(csi::register_volume)
                .delete(csi::deregister_volume),
        )
        .route(
            "/v1/volume/csi/{id}/create",
            post(csi::create_volume).put(csi::create_volume),
        )
        .route("/v1/plugins", get(csi::list_plugins))
        .route("/v1/plugin/csi/{id}", get(csi::read_plugin))
        .route("/v1/metrics", get(metrics::metrics))
        .route("/v1/agent/self", get(agent_self))
        .route("/v1/agent/health", get(agent_health))
        .route("/v1/agent/members", get(agent_members))
        .route("/v1/status/leader", get(cluster::status_leader))
        .route("/v1/status/peers", get(status_peers))
        .route("/v1/regions", get(regions))
}

/// Nomad's paths berth knows, for the 404 of one it does not.
pub const KNOWN_PATHS: &[&str] = &[
    "/v1/jobs",
    "/v1/jobs/parse",
    "/v1/validate/job",
    "/v1/job/:id",
    "/v1/job/:id/allocations",
    "/v1/job/:id/plan",
    "/v1/job/:id/dispatch",
    "/v1/job/:id/summary",
    "/v1/job/:id/versions",
    "/v1/job/:id/evaluations",
    "/v1/job/:id/deployments",
    "/v1/evaluations",
    "/v1/evaluation/:id",
    "/v1/evaluation/:id/allocations",
    "/v1/allocations",
    "/v1/allocation/:id",
    "/v1/allocation/:id/stop",
    "/v1/nodes",
    "/v1/node/:id",
    "/v1/node/:id/allocations",
    "/v1/node/:id/eligibility",
    "/v1/node/:id/drain",
    "/v1/client/allocation/:alloc_id/restart",
    "/v1/client/allocation/:alloc_id/signal",
    "/v1/client/allocation/:alloc_id/stats",
    "/v1/client/stats",
    "/v1/client/fs/logs/:alloc_id",
    "/v1/client/fs/ls/:alloc_id",
    "/v1/client/fs/stat/:alloc_id",
    "/v1/client/fs/cat/:alloc_id",
    "/v1/client/fs/readat/:alloc_id",
    "/v1/event/stream",
    "/v1/volumes",
    "/v1/volume/csi/:id",
    "/v1/volume/csi/:id/create",
    "/v1/plugins",
    "/v1/plugin/csi/:id",
    "/v1/metrics",
    "/v1/agent/self",
    "/v1/agent/health",
    "/v1/agent/members",
    "/v1/status/leader",
    "/v1/status/peers",
    "/v1/regions",
];

#[derive(Debug, Default, Deserialize)]
struct ListQuery {
    #[serde(default)]
    prefix: Option<String>,
    #[serde(flatten)]
    blocking: Blocking,
}

async fn job_summary(
    State(agent): State<Arc<Agent>>,
    Path(id): Path<String>,
    Query(blocking): Query<Blocking>,
) -> Response {
    blocking
        .answer(&agent, || {
            let (status, job) = agent.job_spec(&id)?;
            let allocs: Vec<_> = status
                .allocs
                .iter()
                .filter_map(|a| agent.alloc(&a.id).ok())
                .collect();
            Ok(shapes::job_summary(&status, &job, &allocs))
        })
        .await
}

/// One version: berth keeps the job as last submitted.
async fn job_versions(
    State(agent): State<Arc<Agent>>,
    Path(id): Path<String>,
    Query(blocking): Query<Blocking>,
) -> Response {
    blocking
        .answer(&agent, || {
            let (status, job) = agent.job_spec(&id)?;
            Ok(json!({"Versions": [shapes::job(&job, Some(&status))], "Diffs": null}))
        })
        .await
}

/// A job's evaluations or deployments: none (see the module's table).
async fn job_none(
    State(agent): State<Arc<Agent>>,
    Path(id): Path<String>,
    Query(blocking): Query<Blocking>,
) -> Response {
    blocking
        .answer(&agent, || {
            agent.job_spec(&id)?;
            Ok(json!([]))
        })
        .await
}

async fn read_allocation(
    State(agent): State<Arc<Agent>>,
    Path(id): Path<String>,
    Query(blocking): Query<Blocking>,
) -> Response {
    blocking
        .answer(&agent, || {
            let alloc = agent.alloc(&id)?;
            let (status, job) = agent.job_of_alloc(&alloc)?;
            Ok(shapes::allocation(
                &alloc,
                &job,
                &status,
                &ThisNode::of(&agent),
            ))
        })
        .await
}

async fn stop_allocation(
    State(agent): State<Arc<Agent>>,
    submitter: Option<Extension<Submitter>>,
    Path(id): Path<String>,
) -> Result<Response, NomadError> {
    let runner = alloc_actions::runner(
        &agent,
        &id,
        submitter,
        berth_client::agent::JobAction::StopAlloc,
    )?;
    runner.stop();
    agent.change_index().bump();
    agent.publish_alloc("AllocationUpdateDesiredStatus", &runner.id);
    let index = agent.change_index().current();
    Ok(with_index(
        axum::Json(json!({"EvalID": "", "Index": index})).into_response(),
        index,
    ))
}

async fn validate_job(
    State(agent): State<Arc<Agent>>,
    body: Bytes,
) -> Result<axum::Json<Value>, NomadError> {
    let body: Value = serde_json::from_slice(&body)
        .map_err(|e| bad_request(format!("Failed to decode request: {e}")))?;
    let converted = register::job_hcl(&body).map_err(|e| bad_request(e.to_string()))?;
    let problems = match agent
        .validate_source(&format!("{}.json", converted.id), &converted.hcl)
        .await
    {
        Ok(()) => Vec::new(),
        Err(problems) => problems,
    };
    Ok(axum::Json(json!({
        "DriverConfigValidated": problems.is_empty(),
        "ValidationErrors": problems,
        "Error": problems.join("\n"),
        "Warnings": converted.warnings.join("\n"),
    })))
}

async fn register(
    State(agent): State<Arc<Agent>>,
    submitter: Option<Extension<Submitter>>,
    body: Bytes,
) -> Result<Response, NomadError> {
    register_job(agent, submitter, None, body).await
}

async fn register_at(
    State(agent): State<Arc<Agent>>,
    submitter: Option<Extension<Submitter>>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, NomadError> {
    register_job(agent, submitter, Some(id), body).await
}

async fn register_job(
    agent: Arc<Agent>,
    submitter: Option<Extension<Submitter>>,
    at: Option<String>,
    body: Bytes,
) -> Result<Response, NomadError> {
    let body: Value = serde_json::from_slice(&body)
        .map_err(|e| bad_request(format!("Failed to decode request: {e}")))?;
    let chosen = submission::to_submit(&body).await?;
    if let Some(at) = at
        && at != chosen.id
    {
        return Err(bad_request("Job ID does not match name"));
    }
    let submitted =
        submission::submit(&agent, submission::submitter_of(submitter), &chosen).await?;
    let index = agent.change_index().current();
    let mut warnings = chosen.warnings;
    warnings.extend(submitted.warnings);
    Ok(with_index(
        axum::Json(json!({
            "EvalID": submitted.eval_id,
            "EvalCreateIndex": index,
            "JobModifyIndex": index,
            "Warnings": warnings.join("\n"),
            "Index": index,
            "LastContact": 0,
            "KnownLeader": true,
        }))
        .into_response(),
        index,
    ))
}

#[derive(Debug, Default, Deserialize)]
struct DeregisterQuery {
    #[serde(default)]
    purge: Option<String>,
}

async fn deregister_job(
    State(agent): State<Arc<Agent>>,
    submitter: Option<Extension<Submitter>>,
    Path(id): Path<String>,
    Query(query): Query<DeregisterQuery>,
) -> Result<Response, NomadError> {
    let submitter = submission::submitter_of(submitter);
    // Go's strconv.ParseBool, as Nomad reads it (python-nomad sends `True`).
    let purge = matches!(
        query.purge.as_deref(),
        Some("1" | "t" | "T" | "true" | "TRUE" | "True")
    );
    let action = if purge {
        berth_client::agent::JobAction::Purge
    } else {
        berth_client::agent::JobAction::Stop
    };
    let stopped = agent.stop_job_as(&submitter, &id, action).await?;
    if purge {
        // Purged in the background, as Nomad does it: a job whose allocs stop at once is
        // gone before the answer; a slow one is answered now and purged once they end.
        let purging = {
            let (agent, id) = (agent.clone(), id.clone());
            tokio::spawn(async move { agent.purge_job(&submitter, &id).await })
        };
        let _ = tokio::time::timeout(Duration::from_secs(5), purging).await;
    }
    let index = agent.change_index().current();
    Ok(with_index(
        axum::Json(json!({
            "EvalID": stopped.eval_id,
            "EvalCreateIndex": index,
            "JobModifyIndex": index,
            "Index": index,
            "LastContact": 0,
            "KnownLeader": true,
        }))
        .into_response(),
        index,
    ))
}

/// The most of a log one answer carries: its last bytes, with `origin=end`.
const MAX_LOG_ANSWER: usize = 8 << 20;

#[derive(Debug, Default, Deserialize)]
struct LogsQuery {
    task: Option<String>,
    #[serde(rename = "type")]
    stream: Option<String>,
    origin: Option<String>,
    offset: Option<String>,
    plain: Option<String>,
    follow: Option<String>,
}

/// Go's `strconv.ParseBool`, as Nomad reads a query flag (python-nomad sends `True`).
fn flag(value: Option<&str>) -> bool {
    matches!(value, Some("1" | "t" | "T" | "true" | "TRUE" | "True"))
}

/// A task's stdout or stderr, as Nomad's logs endpoint answers without `follow`: the
/// bytes (`plain=true`) or one frame `{"Data", "File", "Offset"}`. `offset` counts bytes
/// from the `origin` (`start` or `end`) of what the rotated files hold.
async fn task_logs(
    State(agent): State<Arc<Agent>>,
    Path(alloc): Path<String>,
    Query(query): Query<LogsQuery>,
) -> Result<Response, NomadError> {
    let offset: usize = match query.offset.as_deref().filter(|o| !o.is_empty()) {
        None => 0,
        Some(text) => text
            .parse()
            .map_err(|_| bad_request(format!("invalid offset {text:?}")))?,
    };
    let from_end = match query.origin.as_deref().unwrap_or("start") {
        "start" => false,
        "end" => true,
        other => {
            return Err(bad_request(format!(
                "origin must be start or end, not {other:?}"
            )));
        }
    };
    let stream = query.stream.clone().unwrap_or_else(|| "stdout".into());
    if flag(query.follow.as_deref()) {
        let start = if from_end {
            follow_logs::Start::End { bytes: offset }
        } else {
            follow_logs::Start::Beginning { skip: offset }
        };
        let follow = follow_logs::Follow {
            alloc,
            task: query.task.clone(),
            stream,
            plain: flag(query.plain.as_deref()),
            start,
        };
        return follow_logs::answer(agent, follow);
    }
    let log_query = berth_client::agent::logs::LogQuery {
        task: query.task.clone(),
        stream: Some(stream.clone()),
        offset: None,
    };
    let (task, bytes, _) = berth_sys::blocking::run(|| read_whole_log(&agent, &alloc, log_query))?;
    let start = if from_end {
        bytes.len().saturating_sub(offset)
    } else {
        offset.min(bytes.len())
    };
    let bytes = &bytes[start..];
    if flag(query.plain.as_deref()) {
        return Ok((
            [("content-type", "text/plain; charset=utf-8")],
            bytes.to_vec(),
        )
            .into_response());
    }
    use base64::Engine as _;
    Ok(axum::Json(json!({
        "Data": base64::engine::general_purpose::STANDARD.encode(bytes),
        "File": format!("alloc/logs/{task}.{stream}.0"),
        "Offset": start + bytes.len(),
    }))
    .into_response())
}

fn log_error(error: berth_client::agent::logs::LogError) -> NomadError {
    use berth_client::agent::logs::LogError;
    match error {
        LogError::Lookup(lookup) => NomadError::from(lookup),
        LogError::NoSuchTask { .. } => NomadError(StatusCode::NOT_FOUND, error.to_string()),
        LogError::WhichTask { .. } | LogError::Stream(_) => bad_request(error.to_string()),
        LogError::Io { .. } => NomadError(StatusCode::INTERNAL_SERVER_ERROR, error.to_string()),
    }
}

/// Every chunk of a task's log (its last [`MAX_LOG_ANSWER`] bytes at most), the task,
/// and the offset after them.
fn read_whole_log(
    agent: &Agent,
    alloc: &str,
    mut query: berth_client::agent::logs::LogQuery,
) -> Result<(String, Vec<u8>, u64), NomadError> {
    let status = agent.alloc(alloc)?;
    let task = match &query.task {
        Some(task) => task.clone(),
        None => status.tasks.keys().next().cloned().unwrap_or_default(),
    };
    let mut bytes = Vec::new();
    loop {
        let chunk = agent.task_log(alloc, &query).map_err(log_error)?;
        let data = chunk.bytes();
        if data.is_empty() {
            query.offset = Some(chunk.offset);
            break;
        }
        bytes.extend_from_slice(&data);
        if bytes.len() > MAX_LOG_ANSWER {
            bytes.drain(..bytes.len() - MAX_LOG_ANSWER);
        }
        query.offset = Some(chunk.offset);
    }
    Ok((task, bytes, query.offset.unwrap_or(0)))
}

async fn agent_self(State(agent): State<Arc<Agent>>) -> axum::Json<Value> {
    let node = ThisNode::of(&agent);
    axum::Json(json!({
        "config": {
            "Region": shapes::REGION,
            "Datacenter": node.datacenter,
            "NodeName": node.name,
            "DataDir": agent.data_dir().display().to_string(),
            "Version": {"Version": env!("CARGO_PKG_VERSION"), "VersionPrerelease": "", "VersionMetadata": "berth"},
            "Client": {"Enabled": true},
            "Server": {"Enabled": true},
        },
        "member": {
            "Name": format!("{}.{}", node.name, shapes::REGION),
            "Addr": "127.0.0.1",
            "Port": 4648,
            "Status": "alive",
            "Tags": {"region": shapes::REGION, "dc": node.datacenter, "role": "nomad", "build": env!("CARGO_PKG_VERSION")},
        },
        "stats": {},
    }))
}

async fn agent_health() -> axum::Json<Value> {
    axum::Json(json!({
        "client": {"ok": true, "message": "ok"},
        "server": {"ok": true, "message": "ok"},
    }))
}

async fn agent_members(State(agent): State<Arc<Agent>>) -> axum::Json<Value> {
    let node = ThisNode::of(&agent);
    axum::Json(json!({
        "ServerName": node.name,
        "ServerRegion": shapes::REGION,
        "ServerDC": node.datacenter,
        "Members": [{
            "Name": format!("{}.{}", node.name, shapes::REGION),
            "Addr": "127.0.0.1",
            "Port": 4648,
            "Status": "alive",
            "Tags": {"region": shapes::REGION, "dc": node.datacenter, "role": "nomad"},
        }],
    }))
}

async fn status_peers() -> axum::Json<Value> {
    axum::Json(json!(["127.0.0.1:4647"]))
}

async fn regions() -> axum::Json<Value> {
    axum::Json(json!([shapes::REGION]))
}

/// The 404 of a path berth does not serve: Nomad's plain text, naming the nearest path
/// it does.
pub fn not_found(path: &str, method: &str) -> Response {
    let nearest = KNOWN_PATHS
        .iter()
        .chain(["/v1/berth/jobs", "/v1/berth/agent/self"].iter())
        .min_by_key(|known| distance(known, path))
        .copied()
        .unwrap_or("/v1/jobs");
    NomadError(
        StatusCode::NOT_FOUND,
        format!("Invalid method or path: {method} {path} (the nearest berth serves is {nearest})"),
    )
    .into_response()
}

/// Levenshtein distance between two short paths.
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().take(256).collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().take(256).enumerate() {
        let mut previous = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let current = row[j + 1];
            row[j + 1] = (previous + usize::from(ca != *cb))
                .min(row[j] + 1)
                .min(current + 1);
            previous = current;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests;
