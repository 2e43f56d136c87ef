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
//! The paths, their methods and the token scope each needs are the route table's
//! (`crates/api/src/routes.rs`), listed in `docs/api-routes.md`.
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
pub mod alloc_exec;
pub mod alloc_fs;
pub mod checks;
pub(crate) mod cluster;
pub mod csi;
pub(crate) mod evaluations;
pub(crate) mod event_stream;
pub mod exec_session;
pub(crate) mod follow_logs;
pub(crate) mod job_actions;
pub mod metrics;
pub mod register;
mod reschedule;
pub mod services;
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

use axum::Extension;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use berth_client::agent::{Agent, LookupError, Submitter};
use berth_nomad_api::QueryMeta;
use berth_nomad_api::agent::{
    AgentConfig, AgentHealth, AgentHealthResponse, AgentMember, AgentSelf, AgentVersion, Enabled,
    ServerMembers,
};
use berth_nomad_api::allocs::{AllocStopResponse, StreamFrame};
use berth_nomad_api::jobs::{
    JobDeregisterResponse, JobRegisterResponse, JobValidateResponse, JobVersionsResponse,
};
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
    async fn answer<T: Serialize>(
        &self,
        agent: &Agent,
        make: impl FnOnce() -> Result<T, NomadError>,
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

#[derive(Debug, Default, Deserialize)]
pub(crate) struct ListQuery {
    #[serde(default)]
    prefix: Option<String>,
    #[serde(flatten)]
    blocking: Blocking,
}

pub(crate) async fn job_summary(
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
pub(crate) async fn job_versions(
    State(agent): State<Arc<Agent>>,
    Path(id): Path<String>,
    Query(blocking): Query<Blocking>,
) -> Response {
    blocking
        .answer(&agent, || {
            let (status, job) = agent.job_spec(&id)?;
            Ok(JobVersionsResponse {
                versions: vec![shapes::job(&job, Some(&status))],
                diffs: None,
            })
        })
        .await
}

/// A job's evaluations or deployments: none (see the module's table).
pub(crate) async fn job_none(
    State(agent): State<Arc<Agent>>,
    Path(id): Path<String>,
    Query(blocking): Query<Blocking>,
) -> Response {
    blocking
        .answer(&agent, || {
            agent.job_spec(&id)?;
            Ok(Vec::<Value>::new())
        })
        .await
}

pub(crate) async fn read_allocation(
    State(agent): State<Arc<Agent>>,
    Path(id): Path<String>,
    Query(blocking): Query<Blocking>,
) -> Response {
    // One this agent does not run is read from the cluster's records, as any agent of
    // a cluster answers it (a lone agent runs all of its own).
    if matches!(agent.alloc(&id), Err(LookupError::NotFound { .. })) {
        return cluster::read_allocation(&agent, &id, &blocking).await;
    }
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

pub(crate) async fn stop_allocation(
    State(agent): State<Arc<Agent>>,
    submitter: Option<Extension<Submitter>>,
    Path(id): Path<String>,
) -> Result<Response, NomadError> {
    // As Nomad's, from any agent: the scheduler stops the alloc and places its group's
    // again. One the cluster has no report of yet is stopped here, if it runs here.
    let requester = submission::submitter_of(submitter.clone());
    let eval_id = match agent.request_alloc_stop(&requester, &id).await {
        Ok(Ok(Some(eval_id))) => eval_id,
        Ok(Ok(None)) => {
            let runner = alloc_actions::runner(
                &agent,
                &id,
                submitter,
                berth_client::agent::JobAction::StopAlloc,
            )?;
            runner.stop();
            String::new()
        }
        Ok(Err(refused)) => return Err(refused.into()),
        Err(error) => {
            return Err(NomadError(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("stopping alloc {id}: {error}"),
            ));
        }
    };
    agent.change_index().bump();
    agent.publish_alloc("AllocationUpdateDesiredStatus", &id);
    let index = agent.change_index().current();
    Ok(with_index(
        axum::Json(AllocStopResponse { eval_id, index }).into_response(),
        index,
    ))
}

pub(crate) async fn validate_job(
    State(agent): State<Arc<Agent>>,
    body: Bytes,
) -> Result<axum::Json<JobValidateResponse>, NomadError> {
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
    Ok(axum::Json(JobValidateResponse {
        driver_config_validated: problems.is_empty(),
        error: problems.join("\n"),
        validation_errors: problems,
        warnings: converted.warnings.join("\n"),
    }))
}

pub(crate) async fn register(
    State(agent): State<Arc<Agent>>,
    submitter: Option<Extension<Submitter>>,
    body: Bytes,
) -> Result<Response, NomadError> {
    register_job(agent, submitter, None, body).await
}

pub(crate) async fn register_at(
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
        axum::Json(JobRegisterResponse {
            eval_id: submitted.eval_id,
            eval_create_index: index,
            job_modify_index: index,
            warnings: warnings.join("\n"),
            meta: QueryMeta::at(index),
        })
        .into_response(),
        index,
    ))
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct DeregisterQuery {
    #[serde(default)]
    purge: Option<String>,
}

pub(crate) async fn deregister_job(
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
        axum::Json(JobDeregisterResponse {
            eval_id: stopped.eval_id,
            eval_create_index: index,
            job_modify_index: index,
            meta: QueryMeta::at(index),
        })
        .into_response(),
        index,
    ))
}

/// The most of a log one answer carries: its last bytes, with `origin=end`.
const MAX_LOG_ANSWER: usize = 8 << 20;

#[derive(Debug, Default, Deserialize)]
pub(crate) struct LogsQuery {
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
pub(crate) async fn task_logs(
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
    Ok(axum::Json(StreamFrame {
        data: base64::engine::general_purpose::STANDARD.encode(bytes),
        file: format!("alloc/logs/{task}.{stream}.0"),
        offset: u64::try_from(start + bytes.len()).unwrap_or(u64::MAX),
    })
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

pub(crate) async fn agent_self(State(agent): State<Arc<Agent>>) -> axum::Json<AgentSelf> {
    let node = ThisNode::of(&agent);
    let mut tags = this_member(&node).tags;
    tags.insert("build".into(), env!("CARGO_PKG_VERSION").into());
    axum::Json(AgentSelf {
        config: AgentConfig {
            region: shapes::REGION.into(),
            datacenter: node.datacenter.clone(),
            node_name: node.name.clone(),
            data_dir: agent.data_dir().display().to_string(),
            version: AgentVersion {
                version: env!("CARGO_PKG_VERSION").into(),
                version_prerelease: String::new(),
                version_metadata: "berth".into(),
            },
            client: Enabled { enabled: true },
            server: Enabled { enabled: true },
        },
        member: AgentMember {
            tags,
            ..this_member(&node)
        },
        stats: Default::default(),
    })
}

/// This agent as a member of Nomad's gossip pool (berth has none).
fn this_member(node: &ThisNode) -> AgentMember {
    AgentMember {
        name: format!("{}.{}", node.name, shapes::REGION),
        addr: "127.0.0.1".into(),
        port: 4648,
        status: "alive".into(),
        tags: [
            ("region", shapes::REGION),
            ("dc", node.datacenter.as_str()),
            ("role", "nomad"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect(),
    }
}

/// `GET /.well-known/jwks.json`, with no token: the cluster's keys, so that anyone
/// verifies a task's identity (node A's token against node B's JWKS included).
pub(crate) async fn jwks(
    State(agent): State<Arc<Agent>>,
) -> Result<axum::Json<berth_nomad_api::agent::JsonWebKeySet>, NomadError> {
    let keys = agent.identity_keys().await.map_err(|error| {
        // The reason may name the store; the caller needs no token.
        tracing::warn!(%error, "serving the JWKS");
        NomadError(
            StatusCode::SERVICE_UNAVAILABLE,
            "the keyring cannot be read now".into(),
        )
    })?;
    Ok(axum::Json(berth_nomad_api::agent::JsonWebKeySet {
        keys: keys
            .into_iter()
            .map(|(kid, x)| berth_nomad_api::agent::JsonWebKey {
                kty: "OKP".into(),
                crv: "Ed25519".into(),
                x,
                kid,
                alg: "EdDSA".into(),
                use_: "sig".into(),
            })
            .collect(),
    }))
}

pub(crate) async fn agent_health() -> axum::Json<AgentHealthResponse> {
    let ok = || AgentHealth {
        ok: true,
        message: "ok".into(),
    };
    axum::Json(AgentHealthResponse {
        client: ok(),
        server: ok(),
    })
}

pub(crate) async fn agent_members(State(agent): State<Arc<Agent>>) -> axum::Json<ServerMembers> {
    let node = ThisNode::of(&agent);
    axum::Json(ServerMembers {
        server_name: node.name.clone(),
        server_region: shapes::REGION.into(),
        server_dc: node.datacenter.clone(),
        members: vec![this_member(&node)],
    })
}

pub(crate) async fn status_peers() -> axum::Json<[&'static str; 1]> {
    axum::Json(["127.0.0.1:4647"])
}

pub(crate) async fn regions() -> axum::Json<[&'static str; 1]> {
    axum::Json([shapes::REGION])
}

/// The 404 of a path berth does not serve: Nomad's plain text, naming the nearest path
/// it does.
pub fn not_found(path: &str, method: &str) -> Response {
    let nearest = crate::routes::known_paths()
        .into_iter()
        .min_by_key(|known| distance(known, path))
        .unwrap_or_else(|| "/v1/jobs".into());
    // The request's own text, on one line, escaped and cut short: it goes back to the
    // sender only, but a terminal showing it should not be repainted.
    let shown = |text: &str| {
        let text: String = text.chars().take(256).collect();
        berth_model::text::one_line(&text).into_owned()
    };
    NomadError(
        StatusCode::NOT_FOUND,
        format!(
            "Invalid method or path: {} {} (the nearest berth serves is {nearest})",
            shown(method),
            shown(path)
        ),
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
