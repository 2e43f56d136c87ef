//! The agent's HTTP API, on a Unix socket in the data dir by default and on TCP when the
//! operator asks, with tokens ([`access`]). Two sets of paths:
//!
//! - Nomad's (`/v1/jobs`, `/v1/allocation/:id`, …, in [`nomad`]): Nomad's shapes, for
//!   Nomad's tools;
//! - berth's own, under `/v1/berth/` (below), which the CLI ([`client`]) uses today: what
//!   Nomad has no endpoint for (volume snapshots, `system gc`, services) and berth's own
//!   shapes of jobs and allocs.
//!
//! A path neither serves answers 404 naming the nearest one that exists.
//!
//! | method | path | what |
//! |---|---|---|
//! | GET | `/v1/berth/agent/self` | data dir, state file, drivers, start notices |
//! | GET | `/v1/berth/jobs` | every job with its allocs |
//! | POST | `/v1/berth/jobs` | submit `{"source_name": "web.hcl", "source": "<HCL>"}` |
//! | GET | `/v1/berth/job/{id}` | one job |
//! | DELETE | `/v1/berth/job/{id}` | stop a job's allocs |
//! | GET | `/v1/berth/allocations` | every alloc |
//! | GET | `/v1/berth/allocation/{id}` | one alloc (a unique id prefix is enough) |
//! | GET | `/v1/berth/volumes` | CSI volumes with their claims |
//! | POST | `/v1/berth/volumes/register` | register `{"source_name", "source"}` (a volume spec) |
//! | POST | `/v1/berth/volumes/create` | create through the plugin's controller, then register |
//! | GET | `/v1/berth/volume/{id}` | one volume |
//! | DELETE | `/v1/berth/volume/{id}` | deregister a volume nobody claims |
//! | GET | `/v1/berth/plugins` | CSI plugins, their providers and health |
//! | GET | `/v1/berth/plugin/{id}` | one plugin |
//! | GET | `/v1/berth/agent/log-drops` | log messages each driver and hook dropped past its budget |
//!
//! Errors are `{"error": "...", "problems": [...]}` with 400 (bad input), 403 (a job
//! another token owns: [`berth_client::agent::Submitter`]), 404 (unknown id) or 500 (the agent
//! could not record something).

pub mod access;
pub mod client;
pub mod listen;
pub mod nomad;
pub mod routes;

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};

use berth_client::agent::{
    Agent, JobAction, LookupError, NotOwner, Notice, StopError, SubmitError, Submitter, VolumeError,
};
use berth_state::catalog::{PluginStatus, VolumeStatus};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SubmitRequest {
    /// Where the source came from, for messages (e.g. the file name).
    pub source_name: String,
    pub source: String,
    /// Values for the jobspec's variables (`-var`, `-var-file`, `NOMAD_VAR_*`).
    #[serde(default)]
    pub variables: berth_hcl::eval::VariableInputs,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ApiError {
    pub error: String,
    /// One line per problem, for a jobspec that does not pass.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AgentSelf {
    pub data_dir: String,
    pub state_file: Option<String>,
    pub drivers: Vec<String>,
    pub notices: Vec<String>,
}

struct Failure(StatusCode, ApiError);

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        (self.0, Json(self.1)).into_response()
    }
}

impl From<LookupError> for Failure {
    fn from(error: LookupError) -> Self {
        let status = match error {
            LookupError::NotFound { .. } => StatusCode::NOT_FOUND,
            LookupError::Ambiguous { .. } | LookupError::Unreadable { .. } => {
                StatusCode::BAD_REQUEST
            }
            LookupError::Cluster(_) => StatusCode::SERVICE_UNAVAILABLE,
        };
        Failure(
            status,
            ApiError {
                error: error.to_string(),
                problems: Vec::new(),
            },
        )
    }
}

impl From<berth_client::agent::logs::LogError> for Failure {
    fn from(error: berth_client::agent::logs::LogError) -> Self {
        use berth_client::agent::logs::LogError;
        let status = match &error {
            LogError::Lookup(lookup) => match lookup {
                LookupError::NotFound { .. } => StatusCode::NOT_FOUND,
                LookupError::Ambiguous { .. } | LookupError::Unreadable { .. } => {
                    StatusCode::BAD_REQUEST
                }
                LookupError::Cluster(_) => StatusCode::SERVICE_UNAVAILABLE,
            },
            LogError::NoSuchTask { .. } => StatusCode::NOT_FOUND,
            LogError::WhichTask { .. } | LogError::Stream(_) => StatusCode::BAD_REQUEST,
            LogError::Io { .. } => StatusCode::INTERNAL_SERVER_ERROR,
        };
        Failure(
            status,
            ApiError {
                error: error.to_string(),
                problems: Vec::new(),
            },
        )
    }
}

impl From<SubmitError> for Failure {
    fn from(error: SubmitError) -> Self {
        match error {
            SubmitError::Invalid(invalid) => Failure(
                StatusCode::BAD_REQUEST,
                ApiError {
                    error: format!(
                        "{} does not pass validation ({} problem(s))",
                        invalid.file,
                        invalid.problems.len()
                    ),
                    problems: invalid
                        .problems
                        .iter()
                        .map(|p| format!("{}:{p}", invalid.file))
                        .collect(),
                },
            ),
            SubmitError::Refused(why) => Failure(
                StatusCode::BAD_REQUEST,
                ApiError {
                    error: why,
                    problems: Vec::new(),
                },
            ),
            SubmitError::Lookup(lookup) => Failure::from(lookup),
            SubmitError::NotOwner(refused) => Failure::from(refused),
            SubmitError::State(state) => Failure(
                StatusCode::INTERNAL_SERVER_ERROR,
                ApiError {
                    error: state.to_string(),
                    problems: Vec::new(),
                },
            ),
            // The cluster store is away: the job was not submitted; try again.
            SubmitError::Cluster(cluster) => Failure(
                StatusCode::SERVICE_UNAVAILABLE,
                ApiError {
                    error: cluster.to_string(),
                    problems: Vec::new(),
                },
            ),
        }
    }
}

impl From<NotOwner> for Failure {
    fn from(refused: NotOwner) -> Self {
        Failure(
            StatusCode::FORBIDDEN,
            ApiError {
                error: refused.to_string(),
                problems: Vec::new(),
            },
        )
    }
}

impl From<StopError> for Failure {
    fn from(error: StopError) -> Self {
        match error {
            StopError::Lookup(lookup) => Failure::from(lookup),
            StopError::NotOwner(refused) => Failure::from(refused),
        }
    }
}

impl From<VolumeError> for Failure {
    fn from(error: VolumeError) -> Self {
        let (status, problems) = match &error {
            VolumeError::Invalid(invalid) => (
                StatusCode::BAD_REQUEST,
                invalid
                    .problems
                    .iter()
                    .map(|p| format!("{}:{p}", invalid.file))
                    .collect(),
            ),
            VolumeError::Refused(_) => (StatusCode::BAD_REQUEST, Vec::new()),
            VolumeError::NotFound(_) => (StatusCode::NOT_FOUND, Vec::new()),
            VolumeError::Store(_) => (StatusCode::INTERNAL_SERVER_ERROR, Vec::new()),
        };
        let error = match &error {
            VolumeError::Invalid(invalid) => format!(
                "{} is not a valid volume specification ({} problem(s))",
                invalid.file,
                invalid.problems.len()
            ),
            other => other.to_string(),
        };
        Failure(status, ApiError { error, problems })
    }
}

type Reply<T> = Result<Json<T>, Failure>;

pub fn router(agent: Arc<Agent>) -> Router {
    routes::router()
        .fallback(
            |method: axum::http::Method, uri: axum::http::Uri| async move {
                nomad::not_found(uri.path(), method.as_str())
            },
        )
        .with_state(agent)
}

/// Where the API is served: the Unix socket always, TCP when configured.
pub struct Listeners {
    pub socket: tokio::net::UnixListener,
    pub socket_limits: listen::ConnectionLimits,
    pub tcp: Option<(tokio::net::TcpListener, access::AccessPolicy)>,
    pub tcp_limits: listen::ConnectionLimits,
}

/// Serves every listener, each behind its own access policy and connection limits, until
/// one fails.
pub async fn serve(listeners: Listeners, agent: Arc<Agent>) -> std::io::Result<()> {
    // `alloc exec` sessions other members ask of this node's allocs.
    nomad::exec_session::serve_remote_sessions(&agent);
    let guarded = |policy: Arc<access::AccessPolicy>| {
        router(agent.clone()).layer(axum::middleware::from_fn_with_state(
            policy,
            access::enforce,
        ))
    };
    let socket = listen::serve(
        listeners.socket,
        guarded(Arc::new(access::AccessPolicy::socket())),
        listeners.socket_limits,
        None,
    );
    match listeners.tcp {
        None => socket.await,
        Some((tcp, policy)) => {
            let policy = Arc::new(policy);
            // The reserve kept for token holders, where requests need a token.
            let tokens = policy.needs_token().then(|| policy.clone());
            let tcp = listen::serve(tcp, guarded(policy), listeners.tcp_limits, tokens);
            tokio::try_join!(socket, tcp).map(|_| ())
        }
    }
}

/// Binds a TCP listener. Separate from serving, so a taken port is reported before the
/// agent restores anything.
pub async fn bind_tcp(addr: std::net::SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr).await
}

async fn agent_self(State(agent): State<Arc<Agent>>) -> Json<AgentSelf> {
    Json(AgentSelf {
        data_dir: agent.data_dir().display().to_string(),
        state_file: agent.state_file().map(|p| p.display().to_string()),
        drivers: agent
            .drivers()
            .iter()
            .map(|d| d.name().to_string())
            .collect(),
        notices: agent.notices().iter().map(notice_line).collect(),
    })
}

pub fn notice_line(notice: &Notice) -> String {
    format!("[{:?}] {}", notice.level, notice.message)
}

/// The header that carries the id the next page starts at, as Nomad names it.
pub const NEXT_TOKEN_HEADER: &str = "x-nomad-nexttoken";

/// `GET /v1/jobs[?prefix=&per_page=&next_token=]`: jobs in id order; with `per_page`,
/// one page, and the next page's `next_token` in the `X-Nomad-NextToken` header.
async fn list_jobs(
    State(agent): State<Arc<Agent>>,
    axum::extract::Query(query): axum::extract::Query<berth_client::agent::JobsQuery>,
) -> Response {
    let (jobs, next) = agent.jobs_page(&query);
    let mut response = Json(jobs).into_response();
    if let Some(next) = next.and_then(|n| axum::http::HeaderValue::from_str(&n).ok()) {
        response.headers_mut().insert(NEXT_TOKEN_HEADER, next);
    }
    response
}

async fn submit_job(
    State(agent): State<Arc<Agent>>,
    axum::Extension(submitter): axum::Extension<Submitter>,
    Json(request): Json<SubmitRequest>,
) -> Reply<berth_client::agent::Submitted> {
    Ok(Json(
        agent
            .submit_as(
                submitter,
                &request.source_name,
                &request.source,
                &request.variables,
            )
            .await?,
    ))
}

async fn job(
    State(agent): State<Arc<Agent>>,
    Path(id): Path<String>,
) -> Reply<berth_client::agent::JobStatus> {
    Ok(Json(agent.job(&id)?))
}

async fn dispatch_job(
    State(agent): State<Arc<Agent>>,
    submitter: Option<axum::Extension<Submitter>>,
    Path(id): Path<String>,
    Json(request): Json<berth_nomad_api::jobs::JobDispatchRequest>,
) -> Reply<berth_client::agent::Submitted> {
    use base64::Engine as _;
    let payload = match request.payload {
        Some(text) => Some(
            base64::engine::general_purpose::STANDARD
                .decode(text.as_bytes())
                .map_err(|e| {
                    Failure::from(SubmitError::Refused(format!(
                        "the payload is not base64: {e}"
                    )))
                })?,
        ),
        None => None,
    };
    let submitter = nomad::submission::submitter_of(submitter);
    Ok(Json(
        agent
            .dispatch(&submitter, &id, request.meta, payload)
            .await?,
    ))
}

async fn force_periodic(
    State(agent): State<Arc<Agent>>,
    submitter: Option<axum::Extension<Submitter>>,
    Path(id): Path<String>,
) -> Reply<berth_client::agent::Submitted> {
    let submitter = nomad::submission::submitter_of(submitter);
    Ok(Json(agent.force_periodic(&submitter, &id).await?))
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Stopped {
    pub job_id: String,
    pub stopping: Vec<String>,
}

async fn stop_job(
    State(agent): State<Arc<Agent>>,
    submitter: Option<axum::Extension<Submitter>>,
    Path(id): Path<String>,
) -> Reply<Stopped> {
    let submitter = nomad::submission::submitter_of(submitter);
    let stopped = agent.stop_job_as(&submitter, &id, JobAction::Stop).await?;
    Ok(Json(Stopped {
        job_id: id,
        stopping: stopped.allocs,
    }))
}

/// What `POST /v1/system/gc` collected.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Collected {
    /// Allocs.
    pub collected: Vec<String>,
    /// Jobs that had nothing left.
    #[serde(default)]
    pub jobs: Vec<String>,
}

/// The operator's (and a `-dev` agent's): collecting forgets every job's finished
/// allocs, which a token's holder may not decide for other owners' jobs (Nomad's
/// `PUT /v1/system/gc` needs a management token).
async fn system_gc(
    State(agent): State<Arc<Agent>>,
    submitter: Option<axum::Extension<Submitter>>,
) -> Reply<Collected> {
    if let Some(axum::Extension(Submitter::Token { name, .. })) = submitter {
        return Err(Failure(
            StatusCode::FORBIDDEN,
            ApiError {
                error: format!(
                    "Permission denied: token {name:?} may not collect the node's finished \
                     allocs; POST /v1/berth/system/gc is the operator's (the agent's Unix \
                     socket)"
                ),
                problems: Vec::new(),
            },
        ));
    }
    let garbage = agent.collect_garbage();
    Ok(Json(Collected {
        collected: garbage.allocs,
        jobs: garbage.jobs,
    }))
}

async fn list_services(
    State(agent): State<Arc<Agent>>,
) -> Json<berth_client::consul::ServicesStatus> {
    Json(agent.services())
}

async fn list_allocs(
    State(agent): State<Arc<Agent>>,
) -> Json<Vec<berth_client::agent::AllocSummary>> {
    Json(agent.allocs())
}

async fn alloc(
    State(agent): State<Arc<Agent>>,
    Path(id): Path<String>,
) -> Reply<berth_client::alloc_runner::AllocStatus> {
    Ok(Json(agent.alloc(&id)?))
}

/// `GET /v1/client/fs/logs/{alloc}?task=&type=stdout|stderr&offset=`: a chunk of a
/// task's log (Nomad's path; the answer is berth's `LogChunk`).
async fn task_log(
    State(agent): State<Arc<Agent>>,
    Path(alloc): Path<String>,
    axum::extract::Query(query): axum::extract::Query<berth_client::agent::logs::LogQuery>,
) -> Reply<berth_client::agent::logs::LogChunk> {
    Ok(Json(berth_sys::blocking::run(|| {
        agent.task_log(&alloc, &query)
    })?))
}

async fn list_volumes(State(agent): State<Arc<Agent>>) -> Reply<Vec<VolumeStatus>> {
    Ok(Json(agent.volumes()?))
}

async fn register_volume(
    State(agent): State<Arc<Agent>>,
    Json(request): Json<SubmitRequest>,
) -> Reply<VolumeStatus> {
    Ok(Json(
        agent.register_volume(&request.source_name, &request.source)?,
    ))
}

async fn create_volume(
    State(agent): State<Arc<Agent>>,
    Json(request): Json<SubmitRequest>,
) -> Reply<VolumeStatus> {
    Ok(Json(
        agent
            .create_volume(&request.source_name, &request.source)
            .await?,
    ))
}

/// `POST /v1/volumes/snapshot`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SnapshotRequest {
    pub volume_id: String,
    /// The snapshot's name (the plugin's idempotency key); `<volume>-<unix time>` if
    /// left out.
    #[serde(default)]
    pub name: Option<String>,
}

/// `GET` and `DELETE /v1/volumes/snapshot` parameters, as Nomad names them.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SnapshotQuery {
    pub plugin_id: Option<String>,
    pub snapshot_id: Option<String>,
}

async fn create_snapshot(
    State(agent): State<Arc<Agent>>,
    Json(request): Json<SnapshotRequest>,
) -> Reply<berth_model::csi::SnapshotInfo> {
    Ok(Json(
        agent
            .create_snapshot(&request.volume_id, request.name.as_deref())
            .await?,
    ))
}

async fn list_snapshots(
    State(agent): State<Arc<Agent>>,
    axum::extract::Query(query): axum::extract::Query<SnapshotQuery>,
) -> Reply<Vec<berth_model::csi::SnapshotInfo>> {
    Ok(Json(agent.snapshots(query.plugin_id.as_deref()).await?))
}

async fn delete_snapshot(
    State(agent): State<Arc<Agent>>,
    axum::extract::Query(query): axum::extract::Query<SnapshotQuery>,
) -> Reply<SnapshotQuery> {
    let (Some(plugin), Some(snapshot)) = (&query.plugin_id, &query.snapshot_id) else {
        return Err(Failure::from(VolumeError::Refused(
            "deleting a snapshot needs plugin_id and snapshot_id".into(),
        )));
    };
    agent.delete_snapshot(plugin, snapshot).await?;
    Ok(Json(query))
}

async fn volume(State(agent): State<Arc<Agent>>, Path(id): Path<String>) -> Reply<VolumeStatus> {
    Ok(Json(agent.volume(&id)?))
}

async fn deregister_volume(
    State(agent): State<Arc<Agent>>,
    Path(id): Path<String>,
) -> Reply<VolumeStatus> {
    Ok(Json(agent.deregister_volume(&id)?))
}

/// `DELETE /v1/volume/{id}/delete`: DeleteVolume through the plugin, then deregister
/// (Nomad's `/v1/volume/csi/{id}/delete`).
async fn delete_volume(
    State(agent): State<Arc<Agent>>,
    Path(id): Path<String>,
) -> Reply<VolumeStatus> {
    Ok(Json(agent.delete_volume(&id).await?))
}

/// `DELETE /v1/volume/{id}/detach[?force=true]`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct DetachQuery {
    #[serde(default)]
    pub force: bool,
}

async fn detach_volume(
    State(agent): State<Arc<Agent>>,
    Path(id): Path<String>,
    axum::extract::Query(query): axum::extract::Query<DetachQuery>,
) -> Reply<berth_client::agent::Detached> {
    Ok(Json(agent.detach_volume(&id, query.force).await?))
}

async fn list_plugins(State(agent): State<Arc<Agent>>) -> Reply<Vec<PluginStatus>> {
    Ok(Json(agent.plugins()?))
}

async fn plugin(State(agent): State<Arc<Agent>>, Path(id): Path<String>) -> Reply<PluginStatus> {
    Ok(Json(agent.plugin(&id)?))
}
