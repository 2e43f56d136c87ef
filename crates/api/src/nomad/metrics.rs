//! `GET /v1/metrics`: the agent's metrics registry (the `berth-telemetry` crate's) as
//! Nomad serves it, go-metrics' JSON by default and Prometheus' text exposition with
//! `?format=prometheus`; and berth's `GET /v1/berth/agent/log-drops`, the log messages
//! each driver and hook dropped past its budget, which `berth driver list` and `berth
//! hook list` show.
//!
//! The alloc and task gauges are taken when the metrics are read: they count what the
//! agent holds at that moment, so no state change can be missed by a counter kept
//! beside it.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

use super::NomadError;
use super::shapes::ThisNode;
use berth_client::agent::Agent;
use berth_model::events::TaskStateKind;
use berth_model::status::ClientStatus;

/// Prometheus' text exposition format, as its scrapers ask for it.
const PROMETHEUS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

#[derive(Debug, Default, Deserialize)]
pub struct MetricsQuery {
    format: Option<String>,
}

/// `GET /v1/metrics[?format=prometheus]`.
pub async fn metrics(
    State(agent): State<Arc<Agent>>,
    Query(query): Query<MetricsQuery>,
) -> Result<Response, NomadError> {
    record_gauges(&agent);
    let metrics = agent.drivers().metrics();
    match query.format.as_deref().unwrap_or("") {
        "" | "json" => Ok(axum::Json(metrics.summary()).into_response()),
        "prometheus" => Ok((
            [("content-type", PROMETHEUS_CONTENT_TYPE)],
            metrics.prometheus_text(),
        )
            .into_response()),
        other => Err(NomadError(
            StatusCode::BAD_REQUEST,
            format!(
                "unsupported metrics format {:?}: ask for prometheus, or leave format out \
                 for JSON",
                berth_model::text::one_line(other)
            ),
        )),
    }
}

/// Allocs by client status (Nomad's names) and tasks by state (berth's), now.
fn record_gauges(agent: &Agent) {
    let node = ThisNode::of(agent);
    let labels = [
        ("node_id", node.id.as_str()),
        ("datacenter", node.datacenter.as_str()),
    ];
    let (mut pending, mut running, mut terminal) = (0u32, 0u32, 0u32);
    let (mut tasks_pending, mut tasks_running, mut tasks_dead) = (0u32, 0u32, 0u32);
    for summary in agent.allocs() {
        match summary.client_status {
            ClientStatus::Pending => pending += 1,
            ClientStatus::Running => running += 1,
            ClientStatus::Complete | ClientStatus::Failed | ClientStatus::Lost => terminal += 1,
        }
        let Ok(alloc) = agent.alloc(&summary.id) else {
            continue;
        };
        for task in alloc.tasks.values() {
            match task.state {
                TaskStateKind::Pending => tasks_pending += 1,
                TaskStateKind::Running => tasks_running += 1,
                TaskStateKind::Dead => tasks_dead += 1,
            }
        }
    }
    let metrics = agent.drivers().metrics();
    for (name, value) in [
        ("nomad.client.allocations.pending", pending),
        ("nomad.client.allocations.running", running),
        ("nomad.client.allocations.terminal", terminal),
        // One node places its allocs itself: none wait on another's or move between nodes.
        ("nomad.client.allocations.blocked", 0),
        ("nomad.client.allocations.migrating", 0),
        ("berth.client.tasks.pending", tasks_pending),
        ("berth.client.tasks.running", tasks_running),
        ("berth.client.tasks.dead", tasks_dead),
    ] {
        metrics.set_gauge(name, &labels, f64::from(value));
    }
    metrics.set_gauge(
        "nomad.client.uptime",
        &labels,
        metrics.uptime().as_secs() as f64,
    );
}

/// `GET /v1/berth/agent/log-drops`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct LogDrops {
    /// Messages dropped since the agent started, by driver or hook name.
    pub plugins: BTreeMap<String, u64>,
}

pub async fn log_drops(State(agent): State<Arc<Agent>>) -> axum::Json<LogDrops> {
    axum::Json(LogDrops {
        plugins: agent.drivers().metrics().log_drops(),
    })
}
