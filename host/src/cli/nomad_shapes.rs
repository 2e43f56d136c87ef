//! The parts of Nomad's API answers the CLI reads (`api/nomad/shapes.rs` writes them),
//! and the lookups several commands share.

use std::collections::BTreeMap;

use serde::Deserialize;

use berth_api::client::{Client, ClientError};

/// A job id or an alloc id in a path (ids are letters, digits, `.`, `_`, `-`; a child
/// job's `/` and anything else is escaped).
pub(super) fn path_escape(text: &str) -> String {
    super::output::query_escape(text)
}

/// `GET /v1/jobs`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct JobStub {
    #[serde(rename = "ID")]
    pub id: String,
    #[serde(rename = "Type")]
    pub job_type: String,
    pub status: String,
    #[serde(default)]
    pub stop: bool,
}

/// `GET /v1/job/:id`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct JobRead {
    #[serde(rename = "ID")]
    pub id: String,
    #[serde(rename = "Type")]
    pub job_type: String,
    pub status: String,
    #[serde(default)]
    pub stop: bool,
    #[serde(rename = "ParentID", default)]
    pub parent_id: String,
    #[serde(default)]
    pub periodic: Option<serde_json::Value>,
    #[serde(default)]
    pub parameterized_job: Option<serde_json::Value>,
    /// Nanoseconds since the epoch.
    #[serde(default)]
    pub submit_time: u64,
}

/// An alloc, as `GET /v1/allocation/:id` and the alloc lists answer.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct Alloc {
    #[serde(rename = "ID")]
    pub id: String,
    pub name: String,
    #[serde(rename = "JobID")]
    pub job_id: String,
    pub desired_status: String,
    pub client_status: String,
    /// The node that runs it (in a cluster, one of many).
    #[serde(default)]
    pub node_name: String,
    #[serde(default)]
    pub task_states: BTreeMap<String, TaskState>,
}

impl Alloc {
    /// Neither finished nor asked to stop.
    pub fn is_live(&self) -> bool {
        self.desired_status == "run" && matches!(self.client_status.as_str(), "pending" | "running")
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct TaskState {
    pub state: String,
    #[serde(default)]
    pub failed: bool,
    #[serde(default)]
    pub restarts: u64,
    #[serde(default)]
    pub events: Vec<TaskEvent>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct TaskEvent {
    #[serde(rename = "Type")]
    pub kind: String,
    /// Nanoseconds since the epoch.
    pub time: u64,
    #[serde(default)]
    pub display_message: String,
    #[serde(default)]
    pub exit_code: i64,
}

/// Nomad's lowercase status word with a capital, as berth's CLI has always shown it.
pub(super) fn capitalized(word: &str) -> String {
    let mut chars = word.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}

/// The allocs of a job, or none when the agent has no such job.
pub(super) async fn job_allocs(client: &Client, job_id: &str) -> Result<Vec<Alloc>, ClientError> {
    match client
        .get(&format!("/v1/job/{}/allocations", path_escape(job_id)))
        .await
    {
        Err(ClientError::Api(_, status)) if status.as_u16() == 404 => Ok(Vec::new()),
        other => other,
    }
}

/// The full id of the alloc `prefix` names, as Nomad's CLI finds it
/// (`GET /v1/allocations?prefix=`): one match, or an error saying why not.
pub(super) async fn resolve_alloc(client: &Client, prefix: &str) -> anyhow::Result<String> {
    let matches: Vec<Alloc> = client
        .get(&format!("/v1/allocations?prefix={}", path_escape(prefix)))
        .await?;
    if let Some(exact) = matches.iter().find(|a| a.id == prefix) {
        return Ok(exact.id.clone());
    }
    match matches.as_slice() {
        [] => anyhow::bail!("no alloc matches {prefix:?}"),
        [one] => Ok(one.id.clone()),
        many => anyhow::bail!(
            "{prefix:?} matches several allocs ({}): give more of the id",
            many.iter()
                .map(|a| a.id.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}
