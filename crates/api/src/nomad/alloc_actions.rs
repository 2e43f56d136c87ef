//! Nomad's alloc actions on berth: restart and signal a running alloc's tasks.
//!
//! | method | path | body |
//! |---|---|---|
//! | POST, PUT | `/v1/client/allocation/:alloc_id/restart` | `{"TaskName": "web"}` or `{"AllTasks": true}` (both optional) |
//! | POST, PUT | `/v1/client/allocation/:alloc_id/signal` | `{"Signal": "SIGHUP", "Task": "web"}` (`Task` optional) |
//!
//! Both answer `{}` once done, and need a token of scope `submit` (they change what
//! runs) that owns the alloc's job, or the operator (403 naming the owner otherwise). Without a task name they are for every running task of the alloc. A user
//! restart kills the run and starts the task again at once; the restart policy's
//! `attempts` do not count it (the task runner's `control`), and the task shows
//! "Restart Signaled: User requested task to restart", as in Nomad. `AllTasks` restarts
//! every running task too: a finished prestart task is not run again (Nomad's does).
//! A signal goes to the driver's `signal-task`; a name the host cannot send is a 400
//! naming it.
//!
//! Errors: an unknown alloc or task is a 404, a task that is not running (or an alloc
//! with none running) a 400, a driver that refused the signal a 500.

use std::sync::Arc;

use axum::Extension;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use berth_nomad_api::allocs::{AllocRestartRequest, AllocSignalRequest};

use super::{NomadError, bad_request};
use berth_client::agent::{Agent, JobAction, Submitter};
use berth_client::alloc_runner::{ActionError, AllocRunner};
use berth_client::task_runner::ControlError;

/// `POST /v1/client/allocation/:alloc_id/restart`.
pub async fn restart(
    State(agent): State<Arc<Agent>>,
    submitter: Option<Extension<Submitter>>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, NomadError> {
    let request: AllocRestartRequest = decode(&body)?;
    let task = Some(request.task_name.as_str()).filter(|name| !name.is_empty());
    if request.all_tasks && task.is_some() {
        return Err(bad_request(
            "Task name cannot be set when restarting all tasks: send TaskName or AllTasks",
        ));
    }
    let runner = runner(&agent, &id, submitter, JobAction::RestartAlloc)?;
    runner.restart_tasks(task).await.map_err(action_error)?;
    agent.change_index().bump();
    Ok(axum::Json(berth_nomad_api::Empty {}).into_response())
}

/// `POST /v1/client/allocation/:alloc_id/signal`.
pub async fn signal(
    State(agent): State<Arc<Agent>>,
    submitter: Option<Extension<Submitter>>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, NomadError> {
    let request: AllocSignalRequest = decode(&body)?;
    let signal = request.signal.trim();
    if signal.is_empty() {
        return Err(bad_request("Signal is required, for example \"SIGHUP\""));
    }
    // The host sends only the signals it knows by name: refuse the others here, by name,
    // rather than as a driver's refusal after the task was chosen.
    if berth_sys::process::parse_signal(signal).is_err() {
        return Err(bad_request(format!(
            "unknown signal {signal:?}: berth sends SIGHUP, SIGINT, SIGQUIT, SIGTERM, \
             SIGKILL, SIGUSR1, SIGUSR2, SIGCONT and SIGSTOP"
        )));
    }
    let task = Some(request.task.as_str()).filter(|name| !name.is_empty());
    let runner = runner(&agent, &id, submitter, JobAction::SignalAlloc)?;
    runner
        .signal_tasks(task, signal)
        .await
        .map_err(action_error)?;
    agent.change_index().bump();
    Ok(axum::Json(berth_nomad_api::Empty {}).into_response())
}

/// A body may be empty (no task named): Nomad's clients send `{}` or nothing.
fn decode<T: Default + serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, NomadError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(body).map_err(|e| bad_request(format!("Failed to decode request: {e}")))
}

/// The runner of alloc `id`, when `submitter` may `action` it (it owns the alloc's job,
/// or is the operator).
pub(super) fn runner(
    agent: &Agent,
    id: &str,
    submitter: Option<Extension<Submitter>>,
    action: JobAction,
) -> Result<Arc<AllocRunner>, NomadError> {
    let alloc = agent.alloc(id)?;
    let runner = agent
        .alloc_runner(&alloc.id)
        .ok_or_else(|| NomadError(StatusCode::NOT_FOUND, "alloc not found".into()))?;
    let submitter = super::submission::submitter_of(submitter);
    agent.may_change_allocs_of(&submitter, &runner.job.name, action)?;
    Ok(runner)
}

pub(super) fn action_error(error: ActionError) -> NomadError {
    let status = match &error {
        ActionError::NoSuchTask { .. } => StatusCode::NOT_FOUND,
        ActionError::NothingRunning { .. } | ActionError::Task(ControlError::NotRunning { .. }) => {
            StatusCode::BAD_REQUEST
        }
        ActionError::Task(ControlError::Signal { .. } | ControlError::Exec { .. }) => {
            StatusCode::INTERNAL_SERVER_ERROR
        }
    };
    NomadError(status, error.to_string())
}
