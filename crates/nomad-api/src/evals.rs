//! Evaluations: `Evaluation` and `AllocationMetric` (why a group was not placed).

use serde::{Deserialize, Serialize};

use crate::Map;

/// `GET /v1/evaluation/:id`: Nomad's `Evaluation`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct Evaluation {
    #[serde(rename = "ID")]
    pub id: String,
    pub namespace: String,
    pub priority: u32,
    #[serde(rename = "Type")]
    pub job_type: String,
    pub triggered_by: String,
    #[serde(rename = "JobID")]
    pub job_id: String,
    pub job_modify_index: u64,
    #[serde(rename = "NodeID")]
    pub node_id: String,
    pub node_modify_index: u64,
    #[serde(rename = "DeploymentID")]
    pub deployment_id: String,
    pub status: String,
    pub status_description: String,
    /// Nanoseconds.
    pub wait: u64,
    pub next_eval: String,
    pub previous_eval: String,
    pub blocked_eval: String,
    /// `null` when every group was placed.
    #[serde(rename = "FailedTGAllocs")]
    pub failed_tg_allocs: Option<Map<AllocationMetric>>,
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub queued_allocations: Map<u64>,
    pub snapshot_index: u64,
    pub create_index: u64,
    pub modify_index: u64,
    /// Nanoseconds since the epoch.
    pub create_time: u64,
    /// Nanoseconds since the epoch.
    pub modify_time: u64,
}

/// Why a group's allocs were not placed: Nomad's `AllocationMetric`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct AllocationMetric {
    pub nodes_evaluated: u64,
    pub nodes_filtered: u64,
    pub nodes_in_pool: u64,
    /// Eligible nodes per datacenter.
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub nodes_available: Map<u64>,
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub class_filtered: Map<u64>,
    /// Nodes ruled out, per reason.
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub constraint_filtered: Map<u64>,
    pub nodes_exhausted: u64,
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub class_exhausted: Map<u64>,
    /// Nodes without room, per resource.
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub dimension_exhausted: Map<u64>,
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub quota_exhausted: Vec<String>,
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub resources_exhausted: Map<serde_json::Value>,
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub scores: Map<f64>,
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub score_meta_data: Vec<serde_json::Value>,
    /// Nanoseconds.
    pub allocation_time: u64,
    pub coalesced_failures: u64,
}
