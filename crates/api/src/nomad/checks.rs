//! `GET /v1/client/allocation/:id/checks`: the latest result of each check berth runs
//! for the alloc (its provider "nomad" services' and its script checks), as Nomad's
//! client answers it (`nomad alloc checks`).

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Path, State};
use berth_client::agent::Agent;
use berth_client::checks::Health;
use berth_nomad_api::services::CheckQueryResult;

use super::NomadError;

pub async fn alloc_checks(
    State(agent): State<Arc<Agent>>,
    Path(id): Path<String>,
) -> Result<axum::Json<BTreeMap<String, CheckQueryResult>>, NomadError> {
    let alloc = agent.alloc(&id)?;
    let job = alloc.job_id.clone();
    let results = agent
        .check_results(&alloc.id)
        .into_iter()
        .map(|r| {
            let status = match r.outcome.health {
                Health::Passing => "success",
                Health::Warning | Health::Critical => "failure",
            };
            let result = CheckQueryResult {
                id: r.id.clone(),
                check: r.check,
                group: format!("{job}.{}", r.group),
                mode: "healthiness".into(),
                output: r.outcome.output,
                service: r.service,
                status: status.into(),
                status_code: r.outcome.status_code.unwrap_or(0),
                task: r.task,
                timestamp: r.timestamp,
            };
            (r.id, result)
        })
        .collect();
    Ok(axum::Json(results))
}
