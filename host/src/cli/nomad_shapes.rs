//! The Nomad types the CLI reads answers as (`berth_nomad_api`, which the handlers
//! write), and the lookups several commands share.

use serde::de::DeserializeOwned;

use berth_api::client::{Client, ClientError};

/// A job id or an alloc id in a path (ids are letters, digits, `.`, `_`, `-`; a child
/// job's `/` and anything else is escaped).
pub(super) fn path_escape(text: &str) -> String {
    super::output::query_escape(text)
}

/// `GET /v1/jobs`.
pub(super) type JobStub = berth_nomad_api::jobs::JobListStub;
/// `GET /v1/job/:id`.
pub(super) type JobRead = berth_nomad_api::jobs::Job;
/// An alloc, as the alloc lists answer.
pub(super) type Alloc = berth_nomad_api::allocs::AllocationListStub;

/// An answer read as JSON, as its Nomad type: the CLI prints the answer itself with
/// `-json` and reads it typed otherwise.
pub(super) fn typed<T: DeserializeOwned>(answer: serde_json::Value) -> anyhow::Result<T> {
    serde_json::from_value(answer)
        .map_err(|e| anyhow::format_err!("the agent's answer is not in Nomad's shape: {e}"))
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
